# The two commands that do all set-up on a fresh machine:
#   make simulate   - a virtual fleet of boards and phones training Fashion-MNIST under the adaptive
#                     scheduler, watched on a live dashboard, then the same fleet under FedAvg
#   make test       - lint, type-check the core, and the full test suite
# Pass more options through ARGS, e.g.  make simulate ARGS='--seed 1'; the plain federation of 10
# identical clients under FedAvg is  make simulate MAIN=

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
FMNIST := /usr/share/datasets/fashion-mnist
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

MAIN ?= --fleet mixed-24 --dashboard --compare fedavg

.PHONY: simulate test setup data mosquitto deploy-tools browser

simulate: setup data
	FLWR_TELEMETRY_ENABLED=0 $(BIN)/edgesched simulate $(MAIN) $(ARGS)

test: setup data mosquitto deploy-tools browser
	$(BIN)/ruff check .
	$(BIN)/mypy
	FLWR_TELEMETRY_ENABLED=0 $(BIN)/pytest $(PYTEST_ARGS)

setup: $(VENV)/.installed

# torch is installed first and pinned: its CPU wheel is local, while an open range would
# fetch a multi-GB CUDA build. pyproject keeps a range that this pin satisfies.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[simulation,broker,onnx,dashboard,dev]'
	$(BIN)/pip install --quiet --no-deps amqtt==0.12.1
	touch $@

data:
	@if [ -e $(FMNIST)/train-images-idx3-ubyte.gz ] || [ -e $(FMNIST)/train-images-idx3-ubyte ]; then :; \
	elif command -v apt-get >/dev/null; then \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq dataset-fashion-mnist; \
	else echo "Fashion-MNIST is not in $(FMNIST); pass ARGS='--data-dir DIR' to point at its IDX files"; fi

# The tests run a real Mosquitto (started on a free loopback port by a fixture).
mosquitto:
	@if command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ]; then :; \
	elif command -v apt-get >/dev/null; then \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq mosquitto; \
	else echo "mosquitto is not installed: the MQTT tests against it will be skipped"; fi

# The deployment tests lint the scripts with shellcheck and make SuperNode keys with ssh-keygen.
deploy-tools:
	@if command -v shellcheck >/dev/null && command -v ssh-keygen >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq shellcheck openssh-client; \
	else echo "shellcheck or ssh-keygen is not installed: the deployment tests will fail or be skipped"; fi

# The dashboard's test drives a real headless browser: Debian's chromium and its driver.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver; \
	else echo "chromium or chromedriver is not installed: the dashboard's browser test will be skipped"; fi
