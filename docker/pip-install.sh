#!/bin/sh
# pip-install.sh VENV PIP-INSTALL-ARGS...: the image build's pip (Dockerfile stages venv, builder;
# /usr/local/lib/appliance/pip-install in the image).
#
# With WHEELHOUSE_URL set (build.sh serves a wheelhouse), installs only from there
# (--no-index --find-links; plain HTTP on the host's loopback, so --trusted-host), after checking that the wheelhouse was made for this Python
# (WHEELHOUSE_PYTHON, e.g. cp311, when known) and that it answers. Without it, from the index (PIP_INDEX_URL,
# PIP_EXTRA_INDEX_URL as given). Failure modes: one "pip-install: ..." line and exit 1.
set -eu
venv="$1"; shift
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
if [ -n "${WHEELHOUSE_URL:-}" ]; then
    want="$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
    if [ -n "${WHEELHOUSE_PYTHON:-}" ] && [ "$WHEELHOUSE_PYTHON" != "$want" ]; then
        echo "pip-install: the wheelhouse is for $WHEELHOUSE_PYTHON but this base has" \
             "Python $want: remake it with build.sh --python X.Y" >&2
        exit 1
    fi
    if ! python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15).read(1)' \
            "$WHEELHOUSE_URL" 2>/dev/null; then
        echo "pip-install: cannot reach the wheelhouse at $WHEELHOUSE_URL: build.sh serves it on the" \
             "host's loopback to docker build --network host, which a remote or rootless Docker engine" \
             "cannot reach (use build.sh --index there)" >&2
        exit 1
    fi
    host="${WHEELHOUSE_URL#*://}"; host="${host%%/*}"; host="${host%:*}"
    exec "$venv/bin/pip" install -q --no-index --find-links "$WHEELHOUSE_URL" --trusted-host "$host" "$@"
fi
exec "$venv/bin/pip" install -q "$@"
