#!/usr/bin/env bash
# Keys and credentials for an edgesched federation, made on the gateway.
#
#   deploy/make-certs.sh [--dir DIR] ca                  a CA for the fleet (once)
#   deploy/make-certs.sh [--dir DIR] gateway HOSTNAME     the gateway's TLS certificate (Mosquitto
#                                                          and the SuperLink), and its broker login
#   deploy/make-certs.sh [--dir DIR] device DEVICE_ID     enrol one board: its broker password, its
#                                                          SuperNode key pair, and a bundle to copy
#
# DIR (default /etc/edgesched/certs) then holds ca.crt/ca.key, gateway.crt/gateway.key, the
# Mosquitto password file `passwords`, and devices/DEVICE_ID/ with what the board needs:
# ca.crt, supernode.key (its SuperNode's private key) and device.env (its id and broker
# password). Register the board's public key with the SuperLink:
#   flwr supernode register DIR/devices/DEVICE_ID/supernode.key.pub
# and copy the bundle to the board's /etc/edgesched/ (docs/deploy.md). Needs openssl,
# ssh-keygen and mosquitto_passwd.
set -euo pipefail

DIR=/etc/edgesched/certs
DAYS=3650

usage() {
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-2}"
}

die() {
    echo "make-certs.sh: error: $*" >&2
    exit 1
}

need() {
    command -v "$1" >/dev/null || die "$1 is not installed"
}

make_ca() {
    [[ -e "$DIR/ca.key" ]] && die "$DIR/ca.key exists: the fleet already has a CA"
    openssl req -x509 -newkey rsa:3072 -nodes -days "$DAYS" -subj "/CN=edgesched fleet CA" \
        -keyout "$DIR/ca.key" -out "$DIR/ca.crt" 2>/dev/null
    chmod 600 "$DIR/ca.key"
    echo "CA: $DIR/ca.crt"
}

make_gateway() {
    local host=$1
    [[ -e "$DIR/ca.key" ]] || die "no CA in $DIR: run 'make-certs.sh ca' first"
    openssl req -newkey rsa:3072 -nodes -subj "/CN=$host" -keyout "$DIR/gateway.key" \
        -out "$DIR/gateway.csr" 2>/dev/null
    printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\n' "$host" >"$DIR/gateway.ext"
    openssl x509 -req -in "$DIR/gateway.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" -CAcreateserial \
        -days "$DAYS" -extfile "$DIR/gateway.ext" -out "$DIR/gateway.crt" 2>/dev/null
    rm -f "$DIR/gateway.csr" "$DIR/gateway.ext"
    chmod 600 "$DIR/gateway.key"
    add_login gateway >"$DIR/gateway.password"
    chmod 600 "$DIR/gateway.password"
    echo "gateway: $DIR/gateway.crt for $host; broker password in $DIR/gateway.password"
}

add_login() {
    local user=$1 password
    password=$(openssl rand -hex 16)
    touch "$DIR/passwords"
    chmod 600 "$DIR/passwords"
    mosquitto_passwd -b "$DIR/passwords" "$user" "$password"
    echo "$password"
}

make_device() {
    local id=$1 bundle password host=gateway.local
    # The registry's rule for a device id; "gateway" is the gateway's own broker login.
    [[ "$id" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$ ]] ||
        die "device id '$id': use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
    [[ "$id" == gateway ]] && die "device id 'gateway' is the gateway's broker login; choose another"
    [[ -e "$DIR/ca.crt" ]] || die "no CA in $DIR: run 'make-certs.sh ca' first"
    bundle="$DIR/devices/$id"
    [[ -e "$bundle" ]] && die "$bundle exists: $id is already enrolled"
    if [[ -e "$DIR/passwords" ]] && cut -d: -f1 "$DIR/passwords" | grep -qxF -- "$id"; then
        die "$id already has a broker login in $DIR/passwords"
    fi
    mkdir -p "$bundle"
    cp "$DIR/ca.crt" "$bundle/ca.crt"
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "edgesched supernode $id" -f "$bundle/supernode.key"
    password=$(add_login "$id")
    if [[ -e "$DIR/gateway.crt" ]]; then
        host=$(openssl x509 -in "$DIR/gateway.crt" -noout -subject | sed 's/.*CN *= *//')
    fi
    cat >"$bundle/device.env" <<EOF
DEVICE_ID=$id
FLEET=default
GATEWAY=$host
SUPERLINK_PORT=9092
MQTT_PORT=8883
EDGESCHED_MQTT_PASSWORD=$password
EDGESCHED_STATE_DIR=/var/lib/edgesched
FLWR_TELEMETRY_ENABLED=0
LOCAL_DATA=
AGENT_ARGS=
EOF
    chmod 600 "$bundle/device.env" "$bundle/supernode.key"
    echo "device $id: bundle in $bundle; register it with: flwr supernode register $bundle/supernode.key.pub"
}

[[ $# -ge 1 ]] || usage
if [[ $1 == --dir ]]; then
    [[ $# -ge 3 ]] || usage
    DIR=$2
    shift 2
fi
need openssl
mkdir -p "$DIR"
case $1 in
ca) [[ $# -eq 1 ]] || usage; make_ca ;;
gateway) [[ $# -eq 2 ]] || usage; need mosquitto_passwd; make_gateway "$2" ;;
device) [[ $# -eq 2 ]] || usage; need ssh-keygen; need mosquitto_passwd; make_device "$2" ;;
-h | --help) usage 0 ;;
*) usage ;;
esac
