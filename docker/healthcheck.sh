#!/usr/bin/env bash
# appliance-healthcheck: the image's HEALTHCHECK. Healthy when the container's main process
# (recorded by appliance-entrypoint in /run/appliance) is alive and, for a secondary, a socket
# listens on its SSH port. It reads /proc/net/tcp{,6} instead of connecting, so sshd's log
# (docker logs) carries no health-probe noise. Exit 0 healthy, 1 not (Docker's contract).
set -u
state=/run/appliance
mode="$(cat "$state/mode" 2>/dev/null)" || { echo "entrypoint has not finished"; exit 1; }
pid="$(cat "$state/pid" 2>/dev/null)" || exit 1
kill -0 "$pid" 2>/dev/null || { echo "main process $pid is gone"; exit 1; }
if [[ "$mode" == secondary ]]; then
    port="$(cat "$state/ssh_port" 2>/dev/null)" || exit 1
    hex="$(printf ':%04X' "$port")"
    # Columns: sl local_address rem_address st ...; st 0A is LISTEN.
    if ! awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
            /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
        echo "nothing listens on port $port"
        exit 1
    fi
fi
echo "$mode healthy"
exit 0
