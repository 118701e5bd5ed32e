#!/usr/bin/env bash
# Install an edgesched gateway: Debian 12, Ubuntu 22.04 or later, Raspberry Pi OS 64-bit.
#
#   sudo deploy/gateway/install.sh [--dry-run] [--host NAME] [--prefix /opt/edgesched]
#   sudo deploy/gateway/install.sh --broker-files      after enrolling a board
#   sudo deploy/gateway/install.sh --root DIR          the files only, under DIR as if it were /
#
#   --dry-run       print every command instead of running it; changes nothing (no root needed)
#   --host          the name the boards dial, in the gateway's certificate (default: this host's
#                   name with .local, which boards resolve by mDNS; see docs/deploy.md)
#   --prefix        where the venv goes (the units expect /opt/edgesched)
#   --broker-files  only put the broker's files in place (the password file changes with each
#                   enrolled board) and reload the broker if it runs
#   --certs DIR, --broker-dir DIR   where make-certs.sh keeps the fleet's keys and where the
#                   broker reads its files (defaults /etc/edgesched/certs, /etc/mosquitto/conf.d/edgesched)
#   --root DIR      put every file (keys, modes, gateway.env, units) under DIR as if it were /
#                   (the paths inside them are the target's), make the users, and install no
#                   packages, no venv and start nothing: for an image being built, or a test
#                   bench (tests/deploy follows docs/deploy.md this way)
#
# Makes the system user `edgesched`, a venv with edgesched's server extra and CPU torch, the
# fleet's CA and the gateway's certificate (deploy/make-certs.sh, unless they exist), the
# broker's files readable by the unprivileged `mosquitto` user that runs it (Mosquitto drops
# to it before reading them), the gateway's key readable by `edgesched` (the SuperLink and the
# fleet gate), gateway.env with the gateway's broker password, and $FLWR_HOME/config.toml so
# `flwr` finds the SuperLink. It stops the distribution's mosquitto.service (edgesched's broker
# replaces it) and starts the broker, the SuperLink and the fleet gate. Run again, it keeps
# the CA, certificates and passwords it finds.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SOURCE=$(cd "$HERE/../.." && pwd)
DRY_RUN=0
BROKER_ONLY=0
HOST="$(hostname -s 2>/dev/null || echo gateway).local"
PREFIX=/opt/edgesched
TORCH_VERSION=2.13.0
ROOT=""
CERTS=""
BROKER=""

# shellcheck source=SCRIPTDIR/../lib.sh
source "$HERE/../lib.sh"

# Write stdin to a file (mode, owner); in a dry run, show it.
write() {
    local path=$1 mode=$2 owner=$3
    if [[ $DRY_RUN == 1 ]]; then
        echo "+ write $path (mode $mode, owner $owner):"
        sed 's/^/    /'
    else
        install -m "$mode" -o "${owner%:*}" -g "${owner#*:}" /dev/stdin "$path"
    fi
}

while [[ $# -gt 0 ]]; do
    case $1 in
    --dry-run) DRY_RUN=1 ;;
    --host) HOST=${2:?--host needs a name}; shift ;;
    --prefix) PREFIX=${2:?--prefix needs a folder}; shift ;;
    --broker-files) BROKER_ONLY=1 ;;
    --certs) CERTS=${2:?--certs needs a folder}; shift ;;
    --broker-dir) BROKER=${2:?--broker-dir needs a folder}; shift ;;
    --root) ROOT=$(realpath -m "${2:?--root needs a folder}"); shift ;;
    -h | --help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done
[[ $DRY_RUN == 1 || $(id -u) == 0 ]] || die "run as root (sudo), or with --dry-run"
ETC=$ROOT/etc/edgesched
STATE=$ROOT/var/lib/edgesched
FLWR_HOME=$STATE/flwr
CERTS=${CERTS:-$ETC/certs}
BROKER=${BROKER:-$ROOT/etc/mosquitto/conf.d/edgesched}


# Mosquitto starts as the `mosquitto` user and reads its files as that user.
broker_files() {
    run install -d -m 0750 -o root -g mosquitto "$BROKER"
    run install -m 0644 "$SOURCE/deploy/mosquitto/mosquitto.conf" "$SOURCE/deploy/mosquitto/edgesched.acl" \
        "$CERTS/ca.crt" "$BROKER/"
    run install -m 0644 "$CERTS/gateway.crt" "$BROKER/server.crt"
    run install -m 0640 -o root -g mosquitto "$CERTS/gateway.key" "$BROKER/server.key"
    run install -m 0640 -o root -g mosquitto "$CERTS/passwords" "$BROKER/passwords"
}

if [[ $BROKER_ONLY == 1 ]]; then
    broker_files
    if [[ -z $ROOT ]] && systemctl is-active --quiet edgesched-mosquitto.service 2>/dev/null; then
        run systemctl reload edgesched-mosquitto.service
    fi
    exit 0
fi

echo "installing an edgesched gateway for boards dialling $HOST$([[ $DRY_RUN == 1 ]] && echo ' (dry run)')"
system apt-get update -qq
system apt-get install -y -qq mosquitto mosquitto-clients python3-venv openssl openssh-client
system systemctl disable --now mosquitto.service   # the distribution's broker: edgesched-mosquitto takes port 8883
id -u edgesched >/dev/null 2>&1 || run useradd --system --home-dir /var/lib/edgesched --shell /usr/sbin/nologin edgesched
run install -d -m 0750 -o root -g edgesched "$ETC" "$ETC/apps"
run install -d -m 0750 -o root -g root "$CERTS"
run install -d -m 0750 -o edgesched -g edgesched "$STATE" "$FLWR_HOME"

system python3 -m venv "$PREFIX/venv"
system "$PREFIX/venv/bin/pip" install --quiet --upgrade pip
system "$PREFIX/venv/bin/pip" install --quiet "torch==$TORCH_VERSION"
system "$PREFIX/venv/bin/pip" install --quiet "${SOURCE}[server]"
system install -d "$PREFIX/docs"
system cp -r "$SOURCE/docs/." "$PREFIX/docs/"   # the units' Documentation=

[[ -e $CERTS/ca.key ]] || run "$SOURCE/deploy/make-certs.sh" --dir "$CERTS" ca
[[ -e $CERTS/gateway.crt ]] || run "$SOURCE/deploy/make-certs.sh" --dir "$CERTS" gateway "$HOST"
run chgrp edgesched "$CERTS" "$CERTS/gateway.key"   # the SuperLink and the fleet gate serve TLS with it
run chmod 0640 "$CERTS/gateway.key"

broker_files

if [[ ! -e $ETC/gateway.env ]]; then
    password="<from $CERTS/gateway.password>"
    if [[ $DRY_RUN == 0 ]]; then password=$(cat "$CERTS/gateway.password"); fi
    sed "s|^EDGESCHED_MQTT_PASSWORD=.*|EDGESCHED_MQTT_PASSWORD=$password|" "$HERE/gateway.env" \
        | write "$ETC/gateway.env" 0600 root:root
fi
write "$FLWR_HOME/config.toml" 0640 edgesched:edgesched <<EOF
[superlink]
default = "gateway"

[superlink.gateway]
address = "127.0.0.1:9093"
root-certificates = "${CERTS#"$ROOT"}/ca.crt"
EOF

run install -d "$ROOT/etc/systemd/system"
for unit in "$HERE"/*.service; do
    run install -m 0644 "$unit" "$ROOT/etc/systemd/system/$(basename "$unit")"
done
system systemctl daemon-reload
system systemctl enable --now edgesched-mosquitto.service flower-superlink.service edgesched-fleet-gate.service
echo "done: enrol boards with deploy/make-certs.sh device ID (docs/deploy.md, step 2)"
