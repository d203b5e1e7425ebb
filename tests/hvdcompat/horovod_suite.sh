#!/usr/bin/env bash
# horovod_suite.sh: run Horovod's own test files, unmodified, against this appliance.
#
#   bash tests/hvdcompat/horovod_suite.sh [--framework torch|tensorflow] [--test FILE]... [--venv VENV]
#                                         [--np N] HOROVOD_CHECKOUT [IMAGE] [NP]
#
# HOROVOD_CHECKOUT: a copy of Horovod's sources at the release we are compatible with (v0.28.1:
# `git clone --branch v0.28.1 https://github.com/horovod/horovod`); only its test/parallel/ files
# and test/utils/common.py are used, read-only. Horovod's tests are not part of this repository
# (they are Horovod's, and CI cannot fetch them), so this is a script to run by hand where the
# checkout exists, not a CI test. NP (or --np N): ranks, default 2.
#
# Which files: --framework torch (default) is test_torch.py; --framework tensorflow is
# test_tensorflow.py, test_tensorflow_process_sets.py, test_tensorflow_process_sets_dynamic.py and
# test_adasum_tensorflow.py; --test FILE (repeatable) names files of test/parallel instead. Each
# file runs as its own job (a test that fails on some ranks can leave the runtime dead for the
# tests after it, so one file does not take the next one down).
#
# Where: in IMAGE (default appliance:latest, `bash build.sh`) through `horovodrun`, or with
# --venv VENV on this host through VENV's `python -m appliance launch` (the appliance and the
# framework installed in VENV; the horovod package comes from this checkout's shim/ when VENV
# has none).
#
# The suite's own test dependencies (pytest, mock, cloudpickle, packaging) are installed into a
# directory on PYTHONPATH, never into the image or the venv: for the image, wheels for its Python
# into APPLIANCE_CACHE_DIR/horovod-suite-deps (mounted in); for a venv, only those it lacks, into
# APPLIANCE_CACHE_DIR/horovod-suite-deps-host-PYVER. Each rank's full output is kept under
# HOROVOD_SUITE_OUT (default: a fresh directory under /tmp, printed at the end), one folder per
# file. Prints each file's pytest summary per rank and rank 0's FAILED lines. Exit code: non-zero
# when any file's rank 0 pytest failed (real Horovod 0.28.1 fails some tests on today's
# frameworks too: docs/horovod.md names them).
set -euo pipefail

usage="usage: horovod_suite.sh [--framework torch|tensorflow] [--test FILE]... [--venv VENV] [--np N] HOROVOD_CHECKOUT [IMAGE] [NP]"
framework=torch
tests=()
venv=""
np=""
while [ $# -gt 0 ]; do
    case "$1" in
        --framework) framework="${2:?$usage}"; shift 2 ;;
        --test) tests+=("${2:?$usage}"); shift 2 ;;
        --venv) venv="${2:?$usage}"; shift 2 ;;
        --np) np="${2:?$usage}"; shift 2 ;;
        -h|--help) echo "$usage"; exit 0 ;;
        --*) echo "horovod_suite.sh: unknown option $1" >&2; echo "$usage" >&2; exit 2 ;;
        *) break ;;
    esac
done
src="${1:?$usage}"
image="${2:-appliance:latest}"
np="${np:-${3:-2}}"
if [ ${#tests[@]} -eq 0 ]; then
    case "$framework" in
        torch) tests=(test_torch.py) ;;
        tensorflow) tests=(test_tensorflow.py test_tensorflow_process_sets.py test_tensorflow_process_sets_dynamic.py
                           test_adasum_tensorflow.py) ;;
        *) echo "horovod_suite.sh: --framework is torch or tensorflow, not '$framework'" >&2; exit 2 ;;
    esac
fi
src="$(cd "$src" && pwd)"
for t in "${tests[@]}"; do
    [ -f "$src/test/parallel/$t" ] || { echo "horovod_suite.sh: $src has no test/parallel/$t" >&2; exit 2; }
done
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${APPLIANCE_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/appliance}"
out="${HOROVOD_SUITE_OUT:-$(mktemp -d /tmp/horovod-suite.XXXXXX)}"
mkdir -p "$out"

# The suite's dependencies: into $deps/site.
if [ -n "$venv" ]; then
    py="$(cd "$venv" && pwd)/bin/python"
    [ -x "$py" ] || { echo "horovod_suite.sh: $venv has no bin/python" >&2; exit 2; }
    pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    deps="$cache/horovod-suite-deps-host-$pyver"
    missing="$("$py" -c 'import importlib.util as u
print(" ".join(m for m in ("pytest", "mock", "cloudpickle", "packaging") if u.find_spec(m) is None))')"
    if [ -n "$missing" ] && [ ! -f "$deps/.ok-${missing// /-}" ]; then
        rm -rf "$deps"
        # shellcheck disable=SC2086 # one word per package
        "$py" -m pip install -q --target "$deps/site" $missing
        touch "$deps/.ok-${missing// /-}"
    fi
    pypath="$deps/site"
    "$py" -c 'import horovod' 2>/dev/null || pypath="$pypath:$repo/shim"
else
    deps="$cache/horovod-suite-deps"
    pyver="$(docker run --rm --entrypoint /opt/venv/bin/python "$image" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    if [ ! -f "$deps/.ok-$pyver" ]; then
        rm -rf "$deps"
        python3 -m pip download -q --only-binary :all: --python-version "$pyver" -d "$deps/wheels" pytest mock cloudpickle packaging
        python3 -m pip install -q --no-index --no-deps --target "$deps/site" --python-version "$pyver" \
            --only-binary :all: "$deps"/wheels/*.whl
        touch "$deps/.ok-$pyver"
    fi
fi

summary() {  # summary DIR: each rank's pytest summary line, then rank 0's FAILED lines
    for r in $(seq 0 $((np - 1))); do
        echo "  rank $r: $(grep -aE '(passed|failed|skipped|error)' "$1/rank.$r/stdout" 2>/dev/null | tail -n 1)"
    done
    grep -ahE '^(SUB)?(FAILED|ERROR)' "$1/rank.0/stdout" 2>/dev/null | sed 's/^/  /' || true
}

name="horovod-suite-$$"
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
status=0
for t in "${tests[@]}"; do
    dir="$out/${t%.py}"
    mkdir -p "$dir"
    rc=0
    if [ -n "$venv" ]; then
        (cd "$src/test/parallel" && PYTHONPATH="$pypath" PYTHONDONTWRITEBYTECODE=1 \
            "$py" -m appliance launch -np "$np" --no-view --output-filename "$dir" -- \
            "$py" -m pytest -q -p no:cacheprovider "$t" >"$dir/run.log" 2>&1) || rc=$?
    else
        docker run --name "$name" --rm --network none --shm-size 1g \
            -v "$src:/horovod:ro" -v "$deps/site:/suite-deps:ro" -v "$dir:/tmp/out" \
            -e PYTHONPATH=/suite-deps -e PYTHONDONTWRITEBYTECODE=1 \
            -w /horovod/test/parallel --entrypoint /bin/bash "$image" -c \
            "horovodrun -np $np --output-filename /tmp/out python -m pytest -q -p no:cacheprovider $t >/tmp/out/run.log 2>&1" \
            || rc=$?
    fi
    echo "$t at $np ranks (exit $rc):"
    summary "$dir"
    [ "$rc" -eq 0 ] || status=$rc
done
echo "outputs: $out"
exit "$status"
