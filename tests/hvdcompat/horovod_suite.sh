#!/usr/bin/env bash
# horovod_suite.sh: run Horovod's own PyTorch test suite, unmodified, against this appliance.
#
#   bash tests/hvdcompat/horovod_suite.sh HOROVOD_CHECKOUT [IMAGE] [NP]
#
# HOROVOD_CHECKOUT: a copy of Horovod's sources at the release we are compatible with (v0.28.1:
# `git clone --branch v0.28.1 https://github.com/horovod/horovod`); only its test/parallel/
# test_torch.py and test/utils/common.py are used, read-only. Horovod's tests are not part of this
# repository (they are Horovod's, and CI cannot fetch them), so this is a script to run by hand
# where the checkout exists, not a CI test. IMAGE: default appliance:latest (bash build.sh). NP:
# ranks, default 2.
#
# What it does: installs the suite's own test dependencies (pytest, mock, cloudpickle) into a
# host directory that is mounted into the container (the image stays as users get it), then runs
# `horovodrun -np NP python -m pytest test_torch.py` in the container, from the checkout mounted
# read-only, and prints each rank's pytest summary. Each rank's full output is kept in
# HOROVOD_SUITE_OUT (default: a fresh directory under /tmp, printed at the end). Exit code: pytest's on rank 0 (non-zero when
# any test failed; real Horovod 0.28.1 also fails 3 tests on torch 2.13, see README "Coming from
# Horovod").
set -euo pipefail

src="${1:?usage: horovod_suite.sh HOROVOD_CHECKOUT [IMAGE] [NP]}"
image="${2:-appliance:latest}"
np="${3:-2}"
src="$(cd "$src" && pwd)"
[ -f "$src/test/parallel/test_torch.py" ] || { echo "horovod_suite.sh: $src has no test/parallel/test_torch.py" >&2; exit 2; }

cache="${APPLIANCE_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/appliance}"
deps="$cache/horovod-suite-deps"
pyver="$(docker run --rm --entrypoint /opt/venv/bin/python "$image" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ ! -f "$deps/.ok-$pyver" ]; then
    rm -rf "$deps"
    python3 -m pip download -q --only-binary :all: --python-version "$pyver" -d "$deps/wheels" pytest mock cloudpickle
    python3 -m pip install -q --no-index --no-deps --target "$deps/site" --python-version "$pyver" \
        --only-binary :all: "$deps"/wheels/*.whl
    touch "$deps/.ok-$pyver"
fi

name="horovod-suite-$$"
out="${HOROVOD_SUITE_OUT:-$(mktemp -d /tmp/horovod-suite.XXXXXX)}"
mkdir -p "$out"
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
docker run --name "$name" --rm --network none --shm-size 1g \
    -v "$src:/horovod:ro" -v "$deps/site:/suite-deps:ro" -v "$out:/tmp/out" \
    -e PYTHONPATH=/suite-deps -e PYTHONDONTWRITEBYTECODE=1 \
    -w /horovod/test/parallel --entrypoint /bin/bash "$image" -c \
    "horovodrun -np $np --output-filename /tmp/out python -m pytest -q -p no:cacheprovider test_torch.py >/tmp/run.log 2>&1; rc=\$?;
     for r in \$(seq 0 $((np - 1))); do echo \"rank \$r: \$(grep -E '(passed|failed)' /tmp/out/rank.\$r/stdout | tail -n 1)\"; done;
     grep -hE '^(FAILED|ERROR) ' /tmp/out/rank.0/stdout || true; cp /tmp/run.log /tmp/out/; exit \$rc" || rc=$?
echo "outputs: $out"
exit "${rc:-0}"
