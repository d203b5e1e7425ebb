#!/usr/bin/env bash
# appliance-entrypoint: prepares a container of the appliance image, then runs its role.
#
#   secondary [--port N] [--slots N]
#                          sshd in the foreground on port N (default $APPLIANCE_SSH_PORT), key-only,
#                          logging to stderr (docker logs); the container is the "host" the
#                          primary's launcher reaches over SSH. It registers on the share
#                          (SHARED/secondaries/<host name>.json, N slots, default 1) and beats
#                          while it runs: the hosts an elastic primary discovers
#   primary CMD [ARG...]   run CMD (the launcher) in the foreground, as the container's main process
#   write-env              only write the environment files SSH sessions read (used at build time),
#                          /home/mpiuser/.sshd_config's SetEnv line included
#   anything else          run it as given, after the same preparation (e.g. `sshd -t`, `bash`)
#
# Preparation (every mode), from the shared mount $APPLIANCE_SHARED (default /mnt/share), dir ssh/:
#   host key      ssh/ssh_host_ed25519_key (+ .pub) when present (one identity for the whole
#                 cluster, so a shared known_hosts stays valid across restarts), else a fresh
#                 ed25519 key made here on first start; the image itself holds none
#   login keys    ssh/authorized_keys, else ssh/id_ed25519.pub -> /root/.ssh/authorized_keys,
#                 copied with the owner and modes sshd's StrictModes demands (root, 0600 / 0700)
#   client key    ssh/id_ed25519 (+ .pub) -> /root/.ssh/ (0600), ssh/known_hosts likewise
#   environment   /etc/environment (read by PAM for every SSH session, even non-interactive)
#                 and /etc/profile.d/appliance.sh (login shells) get PATH, LD_LIBRARY_PATH, LANG,
#                 PYTHON*, OMPI_*, NCCL_*, HOROVOD_*, NVIDIA_*, CUDA_*, APPLIANCE_* as this
#                 container sees them (names that look like secrets are never written)
#   ssh client    /etc/ssh/ssh_config.d/00-appliance-port.conf: Port $APPLIANCE_SSH_PORT, so plain
#                 `ssh node2` and mpirun's daemons (OpenMPI's rsh agent is ssh) reach the cluster's
#                 sshd with the cluster's key (docker/ssh_config) and no -p or plm_rsh_args; host
#                 keys accepted once into ~/.ssh/known_hosts (these override /etc/ssh/ssh_config's
#                 Kubernetes values: port 2222, no known_hosts)
# The appliance's sshd reads /etc/ssh/sshd_config.appliance. The image's other modes need no
# entrypoint (Kubernetes replaces it): `/usr/sbin/sshd -De` as root (/etc/ssh/sshd_config) or
# `sshd -De -f /home/mpiuser/.sshd_config` as uid 1000, both on 2222 with the mounted id_rsa.
#   health        /run/appliance/{mode,pid,ssh_port} for appliance-healthcheck
#
# Env: APPLIANCE_SHARED, APPLIANCE_SSH_PORT (secondary's port, default 12345).
# Failure modes: one "appliance-entrypoint: ERROR: ..." line and exit 2 for a bad port, or a
# secondary with no key to authorize (it would accept no one); sshd's own errors (port in use)
# end the container with sshd's exit code.
set -euo pipefail

SHARED="${APPLIANCE_SHARED:-/mnt/share}"
KEYDIR="$SHARED/ssh"
STATE=/run/appliance
SSHD_CONFIG=/etc/ssh/sshd_config.appliance   # /etc/ssh/sshd_config is Kubernetes' root sshd (port 2222)
MPIUSER_HOME=/home/mpiuser
MPIUSER_SSHD_TEMPLATE=/usr/local/lib/appliance/mpiuser-sshd_config

say() { echo "appliance-entrypoint: $*" >&2; }
die() { say "ERROR: $*"; exit 2; }

# --- environment for SSH sessions ------------------------------------------------------------
env_names() {
    compgen -e | grep -E '^(PATH|LD_LIBRARY_PATH|LANG|LC_ALL|PYTHON[A-Z_]*|OMPI_[A-Za-z0-9_]+|NCCL_[A-Z0-9_]+|HOROVOD_[A-Z0-9_]+|NVIDIA_[A-Z0-9_]+|CUDA_[A-Z0-9_]+|APPLIANCE_[A-Z0-9_]+)$' \
        | grep -v -E 'SECRET|TOKEN|PASSW|CREDENTIAL|_KEY$' || true
}

write_env() {
    local name value tmp_env tmp_prof
    tmp_env="$(mktemp /etc/environment.XXXXXX)"
    tmp_prof="$(mktemp /etc/profile.d/appliance.XXXXXX)"
    echo "# Written by appliance-entrypoint from the container's environment; do not edit." >"$tmp_env"
    echo "# Written by appliance-entrypoint: the image's environment for login shells." >"$tmp_prof"
    for name in $(env_names); do
        value="${!name}"
        [[ "$value" == *$'\n'* || "$value" == *'"'* ]] && continue
        printf '%s="%s"\n' "$name" "$value" >>"$tmp_env"
        printf 'export %s=%q\n' "$name" "$value" >>"$tmp_prof"
    done
    chmod 0644 "$tmp_env" "$tmp_prof"
    mv -f "$tmp_env" /etc/environment
    mv -f "$tmp_prof" /etc/profile.d/appliance.sh
    write_mpiuser_sshd_config
}

# mpiuser's sshd (Kubernetes, non-root) has no PAM: the same environment as one SetEnv line (sshd
# reads only the first SetEnv), after the static part of the config.
write_mpiuser_sshd_config() {
    local name value line="SetEnv" tmp
    [[ -f "$MPIUSER_SSHD_TEMPLATE" && -d "$MPIUSER_HOME" ]] || return 0
    for name in $(env_names); do
        value="${!name}"
        [[ "$value" == *$'\n'* || "$value" == *'"'* ]] && continue
        line+=" \"$name=$value\""
    done
    tmp="$(mktemp "$MPIUSER_HOME/.sshd_config.XXXXXX")"
    { cat "$MPIUSER_SSHD_TEMPLATE"; echo "# Written by appliance-entrypoint write-env: the image's environment."; echo "$line"; } >"$tmp"
    chmod 0644 "$tmp"
    chown "$(stat -c %u:%g "$MPIUSER_HOME")" "$tmp"
    mv -f "$tmp" "$MPIUSER_HOME/.sshd_config"
}

# --- SSH keys ----------------------------------------------------------------------------------
install_host_key() {
    if [[ -f "$KEYDIR/ssh_host_ed25519_key" ]]; then
        install -m 0600 -o root -g root "$KEYDIR/ssh_host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
        if [[ -f "$KEYDIR/ssh_host_ed25519_key.pub" ]]; then
            install -m 0644 -o root -g root "$KEYDIR/ssh_host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
        else
            ssh-keygen -y -f /etc/ssh/ssh_host_ed25519_key >/etc/ssh/ssh_host_ed25519_key.pub
        fi
    elif [[ ! -s /etc/ssh/ssh_host_ed25519_key ]]; then
        rm -f /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub
        ssh-keygen -q -t ed25519 -N '' -C "appliance-host@$(hostname)" -f /etc/ssh/ssh_host_ed25519_key
    fi
}

# Prints where the login keys came from (empty: none found).
install_login_keys() {
    local src=""
    if [[ -s "$KEYDIR/authorized_keys" ]]; then
        src="$KEYDIR/authorized_keys"
    elif [[ -s "$KEYDIR/id_ed25519.pub" ]]; then
        src="$KEYDIR/id_ed25519.pub"
    fi
    if [[ -n "$src" ]]; then
        install -m 0600 -o root -g root "$src" /root/.ssh/authorized_keys
        echo "$src"
    elif [[ -s /root/.ssh/authorized_keys ]]; then
        # Mounted in by hand: make its modes acceptable if we can (a read-only mount cannot).
        chown root:root /root/.ssh/authorized_keys 2>/dev/null || true
        chmod 0600 /root/.ssh/authorized_keys 2>/dev/null || true
        echo /root/.ssh/authorized_keys
    fi
}

install_client_key() {
    if [[ -f "$KEYDIR/id_ed25519" ]]; then
        install -m 0600 -o root -g root "$KEYDIR/id_ed25519" /root/.ssh/id_ed25519
        [[ -f "$KEYDIR/id_ed25519.pub" ]] \
            && install -m 0644 -o root -g root "$KEYDIR/id_ed25519.pub" /root/.ssh/id_ed25519.pub
    fi
    if [[ -f "$KEYDIR/known_hosts" ]]; then
        install -m 0644 -o root -g root "$KEYDIR/known_hosts" /root/.ssh/known_hosts
    fi
}

prepare() {
    export APPLIANCE_SSH_PORT="${APPLIANCE_SSH_PORT:-12345}"  # for SSH sessions too (write_env)
    mkdir -p /run/sshd "$STATE" /root/.ssh
    chmod 0755 /run/sshd
    chmod 0700 /root /root/.ssh
    chown root:root /root /root/.ssh
    install_host_key
    install_client_key
    write_ssh_port
    write_env
}

write_ssh_port() {  # the cluster's sshd port for every ssh client in this container (mpirun's too)
    local port="${APPLIANCE_SSH_PORT:-12345}"
    valid_port "$port" || die "APPLIANCE_SSH_PORT '$port' is not a number in 1..65535"
    {
        echo "# Written by appliance-entrypoint: the cluster's sshd port (APPLIANCE_SSH_PORT) and host-key policy."
        echo "Port $port"
        echo "StrictHostKeyChecking accept-new"
        echo "UserKnownHostsFile ~/.ssh/known_hosts ~/.ssh/known_hosts2"
    } >/etc/ssh/ssh_config.d/00-appliance-port.conf
    chmod 0644 /etc/ssh/ssh_config.d/00-appliance-port.conf
}

record() {  # record MODE [PORT]: what appliance-healthcheck checks
    echo "$1" >"$STATE/mode"
    echo "$$" >"$STATE/pid"
    if [[ -n "${2:-}" ]]; then echo "$2" >"$STATE/ssh_port"; else rm -f "$STATE/ssh_port"; fi
}

valid_port() { [[ "$1" =~ ^[0-9]+$ ]] && (("$1" >= 1 && "$1" <= 65535)); }

# --- modes -------------------------------------------------------------------------------------
mode="${1:-secondary}"
if (($#)); then shift; fi

case "$mode" in
    write-env)
        write_env
        ;;
    secondary)
        port="${APPLIANCE_SSH_PORT:-12345}" slots=1
        while (($#)); do
            case "$1" in
                -p|--port|--ssh-port) port="${2:-}"; shift 2 || die "$1 needs a port number" ;;
                --port=*|--ssh-port=*) port="${1#*=}"; shift ;;
                --slots) slots="${2:-}"; shift 2 || die "$1 needs a number" ;;
                --slots=*) slots="${1#*=}"; shift ;;
                *) die "secondary: unknown argument '$1' (usage: secondary [--port N] [--slots N])" ;;
            esac
        done
        valid_port "$port" || die "secondary: SSH port '$port' is not a number in 1..65535"
        [[ "$slots" =~ ^[1-9][0-9]{0,3}$ ]] || die "secondary: --slots '$slots' is not a positive number"
        export APPLIANCE_SSH_PORT="$port"
        prepare
        src="$(install_login_keys)"
        [[ -n "$src" ]] || die "secondary: no key to authorize: expected $KEYDIR/authorized_keys or" \
            "$KEYDIR/id_ed25519.pub (create them with 'appliance keys --shared $SHARED' and mount" \
            "$SHARED into the container)"
        say "sshd on port $port, host key $(ssh-keygen -l -f /etc/ssh/ssh_host_ed25519_key.pub | cut -d' ' -f2), login keys from $src"
        record secondary "$port"
        # Registered on the share once sshd answers, beating while the container runs: what an
        # elastic primary discovers (appliance.cluster.heartbeat; its lines go to docker logs).
        if [[ -d "$SHARED" && -x /opt/venv/bin/python ]]; then
            /opt/venv/bin/python -m appliance.cluster.heartbeat --port "$port" --slots "$slots" --shared "$SHARED" &
        fi
        exec /usr/sbin/sshd -D -e -f "$SSHD_CONFIG" -p "$port"
        ;;
    primary)
        (($#)) || die "primary: no command given (usage: primary CMD [ARG...])"
        prepare
        install_login_keys >/dev/null || true
        record primary
        exec "$@"
        ;;
    *)
        prepare
        install_login_keys >/dev/null || true
        record other
        exec "$mode" "$@"
        ;;
esac
