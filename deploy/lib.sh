# shellcheck shell=bash
# What deploy/*/install.sh share: a one-line error, and running a command, or only printing it
# in a dry run (DRY_RUN=1); `system` for what acts on the running system (packages, the venv,
# systemd), left out when the files go under another root (ROOT). Sourced, not run.

die() {
    echo "install.sh: error: $*" >&2
    exit 1
}

run() {
    if [[ $DRY_RUN == 1 ]]; then
        printf '+'
        printf ' %q' "$@"
        printf '\n'
    else
        "$@"
    fi
}

system() {
    [[ -n ${ROOT:-} ]] || run "$@"
}
