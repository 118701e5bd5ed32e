#!/usr/bin/env bash
# Install edgesched on a board: Raspberry Pi OS 64-bit (Pi 4 or 5) or a Jetson with JetPack 6.
#
#   sudo deploy/device/install.sh [--dry-run] [--board rpi|jetson|generic] [--bundle DIR]
#                                 [--torch-index URL] [--prefix /opt/edgesched] [--root DIR]
#
#   --dry-run      print every command instead of running it; changes nothing (no root needed)
#   --board        what this is (default: detected from /proc/device-tree/model and
#                  /etc/nv_tegra_release)
#   --bundle       the board's enrolment bundle from deploy/make-certs.sh device ID (ca.crt,
#                  supernode.key, device.env), copied to /etc/edgesched/
#   --torch-index  Jetson only, required there: the pip index of NVIDIA's torch wheels for this
#                  JetPack (see docs/deploy.md)
#   --root         put the files (bundle, modes, units) under DIR as if it were /, make the
#                  user, and install no packages, no venv and start nothing: for an image being
#                  built, or a test bench (tests/deploy follows docs/deploy.md this way)
#
# torch: a Raspberry Pi takes the CPU wheel from PyPI (torch==2.13.0 has manylinux aarch64
# wheels; a Pi has no GPU to use). A Jetson must not: PyPI's aarch64 wheels are CPU-only, and
# its GPU needs the build NVIDIA makes against JetPack's own CUDA and cuDNN, served from
# NVIDIA's index for that JetPack release. Then edgesched's client extra (Flower's SuperNode and
# the ClientApp), a system user, and the SuperNode and agent systemd units, enabled and started.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SOURCE=$(cd "$HERE/../.." && pwd)
DRY_RUN=0
BOARD=""
BUNDLE=""
TORCH_INDEX=""
PREFIX=/opt/edgesched
TORCH_VERSION=2.13.0
ROOT=""

# shellcheck source=SCRIPTDIR/../lib.sh
source "$HERE/../lib.sh"

detect_board() {
    if [[ -e /etc/nv_tegra_release ]]; then
        echo jetson
    elif grep -qs "Raspberry Pi" /proc/device-tree/model; then
        echo rpi
    else
        echo generic
    fi
}

while [[ $# -gt 0 ]]; do
    case $1 in
    --dry-run) DRY_RUN=1 ;;
    --board) BOARD=${2:?--board needs rpi, jetson or generic}; shift ;;
    --bundle) BUNDLE=${2:?--bundle needs a folder}; shift ;;
    --torch-index) TORCH_INDEX=${2:?--torch-index needs a URL}; shift ;;
    --prefix) PREFIX=${2:?--prefix needs a folder}; shift ;;
    --root) ROOT=$(realpath -m "${2:?--root needs a folder}"); shift ;;
    -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done

BOARD=${BOARD:-$(detect_board)}
case $BOARD in
rpi | generic) TORCH=(pip install "torch==$TORCH_VERSION") ;;
jetson)
    [[ -n $TORCH_INDEX ]] || die "a Jetson needs --torch-index: NVIDIA's wheel index for its JetPack (docs/deploy.md)"
    TORCH=(pip install --index-url "$TORCH_INDEX" torch)
    ;;
*) die "--board $BOARD: use rpi, jetson or generic" ;;
esac
[[ -z $BUNDLE || -f $BUNDLE/device.env ]] || die "$BUNDLE has no device.env: make it with deploy/make-certs.sh device ID"
[[ $DRY_RUN == 1 || $(id -u) == 0 ]] || die "run as root (sudo), or with --dry-run"
[[ $(uname -m) == aarch64 || $BOARD == generic || $DRY_RUN == 1 ]] || die "needs a 64-bit OS (uname -m: $(uname -m))"

echo "installing edgesched for a $BOARD board into $PREFIX$([[ $DRY_RUN == 1 ]] && echo ' (dry run)')"
system apt-get update -qq
system apt-get install -y -qq python3-venv python3-dev
id -u edgesched >/dev/null 2>&1 || run useradd --system --home-dir /var/lib/edgesched --shell /usr/sbin/nologin edgesched
system python3 -m venv "$PREFIX/venv"
system "$PREFIX/venv/bin/pip" install --quiet --upgrade pip
system "$PREFIX/venv/bin/${TORCH[0]}" "${TORCH[@]:1}"
system "$PREFIX/venv/bin/pip" install --quiet "${SOURCE}[client,onnx]"   # onnx: evaluate-with onnxruntime, --speed-test
ETC=$ROOT/etc/edgesched
run install -d -m 0750 -o edgesched -g edgesched "$ETC" "$ETC/certs" "$ROOT/var/lib/edgesched"
if [[ -n $BUNDLE ]]; then
    run install -m 0600 -o edgesched -g edgesched "$BUNDLE/device.env" "$ETC/device.env"
    run install -m 0644 "$BUNDLE/ca.crt" "$ETC/certs/ca.crt"
    run install -m 0600 -o edgesched -g edgesched "$BUNDLE/supernode.key" "$ETC/certs/supernode.key"
elif [[ ! -e $ETC/device.env ]]; then
    run install -m 0600 -o edgesched -g edgesched "$HERE/device.env" "$ETC/device.env"
    echo "edit /etc/edgesched/device.env (device id, gateway, broker password) before the services start"
fi
run install -d "$ROOT/etc/systemd/system"
for unit in flower-supernode.service edgesched-agent.service; do
    run install -m 0644 "$HERE/$unit" "$ROOT/etc/systemd/system/$unit"
done
system systemctl daemon-reload
system systemctl enable --now flower-supernode.service edgesched-agent.service
echo "done: journalctl -u flower-supernode -u edgesched-agent -f shows them"
