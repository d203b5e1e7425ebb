#!/usr/bin/env bash
# docker-up.sh: make sure a Docker engine answers on this machine, or fail loudly.
#
# What it owns: installing docker.io, docker-compose (v1) and debootstrap from Debian when they
# are missing, and starting `dockerd` in the background (no systemd here) when `docker info`
# does not answer. Idempotent: a second run with a live engine returns at once; concurrent runs
# serialise on a lock file so only one daemon is ever started.
#
# Env:
#   DOCKER_UP_TIMEOUT   seconds to wait for the engine to answer (default 60)
#   DOCKERD_LOG         daemon log file (default /var/log/appliance-dockerd.log)
#   DOCKER_UP_LOCK      lock file (default /run/lock/appliance-docker-up.lock)
#   DOCKERD_NICE        niceness of a dockerd this script starts, and so of every container
#                       process (default 0; .ci/run sets 10: the image builds that overlap the
#                       CPU tests yield the cores to them; the Docker tier runs last, alone)
#
# Failure modes: exits non-zero with one "docker-up: ERROR: ..." line, followed by the last lines
# of the daemon log, when the packages cannot be installed, the daemon dies, or it does not answer
# within the bound. It never skips: a CI tier that depends on Docker must see the failure.
set -euo pipefail

TIMEOUT="${DOCKER_UP_TIMEOUT:-60}"
LOG="${DOCKERD_LOG:-/var/log/appliance-dockerd.log}"
LOCK="${DOCKER_UP_LOCK:-/run/lock/appliance-docker-up.lock}"
NICE="${DOCKERD_NICE:-0}"
[[ "$NICE" =~ ^-?[0-9]+$ ]] || { echo "docker-up: ERROR: DOCKERD_NICE=$NICE: expected a whole number" >&2; exit 1; }
PIDFILE=/var/run/docker.pid

say() { echo "docker-up: $*" >&2; }
die() {
    say "ERROR: $*"
    if [[ -f "$LOG" ]]; then
        say "last lines of $LOG:"
        tail -n 25 "$LOG" | sed 's/^/    /' >&2
    fi
    exit 1
}

SUDO=()
if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || die "not root and no sudo: cannot install or start Docker"
    SUDO=(sudo -n)
fi

engine_answers() { docker info >/dev/null 2>&1; }

# Fast path: nothing to do.
if command -v docker >/dev/null && command -v docker-compose >/dev/null \
    && command -v debootstrap >/dev/null && engine_answers; then
    say "engine up ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
    exit 0
fi

mkdir -p "$(dirname "$LOCK")" 2>/dev/null || true
exec 9>"$LOCK"
flock -w 600 9 || die "could not take $LOCK within 600 s (another docker-up stuck?)"

# 1. Packages. dockerd comes with docker.io; /usr/bin/docker too (a newer client elsewhere on
#    PATH is fine: it negotiates the API version down).
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
    say "installing ${missing[*]} (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt_opts=(-q -y -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef
              -o Dpkg::Options::=--force-confold)
    "${SUDO[@]}" apt-get "${apt_opts[@]}" update >/dev/null \
        || die "apt-get update failed"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" \
        install --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
fi
command -v docker >/dev/null || die "no docker client on PATH after installing docker.io"

# 2. Daemon. Start one only if none is running (a starting daemon gets the same wait).
if engine_answers; then
    say "engine up ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
    exit 0
fi
if ! pgrep -x dockerd >/dev/null; then
    if [[ -f "$PIDFILE" ]] && ! kill -0 "$(cat "$PIDFILE" 2>/dev/null)" 2>/dev/null; then
        say "removing stale $PIDFILE"
        "${SUDO[@]}" rm -f "$PIDFILE"
    fi
    "${SUDO[@]}" mkdir -p "$(dirname "$LOG")"
    say "starting dockerd (log: $LOG, nice $NICE)"
    # Own session, no terminal, output only to the log: it outlives this script on purpose.
    "${SUDO[@]}" setsid -f nice -n "$NICE" dockerd </dev/null >>"$LOG" 2>&1
else
    say "dockerd is running but not answering yet; waiting"
fi

# 3. Wait, bounded. A daemon that exits is reported at once rather than after the timeout.
deadline=$((SECONDS + TIMEOUT))
while ! engine_answers; do
    ((SECONDS < deadline)) || die "Docker engine did not answer 'docker info' within ${TIMEOUT} s"
    sleep 1
    if ! pgrep -x dockerd >/dev/null; then
        sleep 1
        engine_answers && break
        die "dockerd exited while starting"
    fi
done
say "engine up ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?')," \
    "storage $(docker info --format '{{.Driver}}' 2>/dev/null || echo '?'))"
