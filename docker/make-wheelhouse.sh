#!/usr/bin/env bash
# make-wheelhouse.sh: download, on the host, every wheel the image installs, for the image's Python.
#
#   bash docker/make-wheelhouse.sh DIR [--cpu | --gpu] [--tensorflow] [--python 3.11] [--glibc 2.35]
#                                      [--host-pip-config] [--refresh]
#
# What it owns: DIR, filled by `pip download` (binary wheels only, CPython X.Y, manylinux x86_64
# from glibc 2.17 up to the given glibc) with the variant's requirements and
# docker/build-requirements.txt, plus DIR/PYTHON_TAG (e.g. cp311, checked by the Dockerfile),
# DIR/VARIANT and DIR/.stamp. A second run with the same requirements, variant, Python and glibc
# finds the stamp and returns at once; concurrent runs on one DIR serialise on DIR.lock.
#
#   --cpu (default)  docker/requirements.txt through the host's pip as configured: torch is
#                    whatever it resolves for torch==2.13.0 (this project's machines hand out a
#                    local CPU wheel). No torchvision: PyPI's torchvision needs CUDA torch's
#                    libraries and does not import beside CPU torch. build.sh does not use it
#                    (both images install requirements-gpu.txt); for a wheelhouse of your own.
#   --gpu            docker/requirements-gpu.txt (+ torchvision) with `pip download --isolated`,
#                    i.e. straight from PyPI, ignoring the host's pip config and PIP_* env (which
#                    may serve a CPU torch): PyPI's torch is the CUDA 13 build and brings the CUDA
#                    runtime, cuDNN, cuBLAS and NCCL as nvidia-* wheels (~2.6 GB, ~35 wheels).
#                    The result is checked: no "+cpu" torch, an nvidia-nccl wheel present.
#   --host-pip-config  with --gpu: use the host's pip config anyway (a mirror or proxy that
#                    serves PyPI's CUDA wheels); the checks above still apply.
#   --tensorflow     the TensorFlow set instead (its own stamp, DIR/.stamp-tf; build.sh keeps it in
#                    a directory of its own, so the torch layer's wheel list does not change):
#                    docker/requirements-tf.txt with its dependencies (tensorflow-cpu: its 2.21
#                    wheel is manylinux_2_27, found through the glibc range below) and
#                    requirements-tf-nodeps.txt without (tf-keras declares `tensorflow`, the same
#                    module that tensorflow-cpu installs under another name). --gpu/--cpu pick
#                    --isolated as above. Checked: a tensorflow_cpu and a tf_keras wheel.
#
# This is how images get built where containers cannot reach an index, and how air-gapped
# clusters get their wheelhouse (copy DIR there, then build.sh --wheelhouse DIR).
#
# Failure modes: pip's error (a package without a wheel for that Python, no index) or a failed
# check ends in one "make-wheelhouse: ERROR: ..." line and a non-zero exit; DIR keeps what was
# downloaded, without a stamp.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYVER=3.11
GLIBC=2.35
REFRESH=0
VARIANT=cpu
ISOLATED=auto
SET=base
DIR=""

say() { echo "make-wheelhouse: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

while (($#)); do
    case "$1" in
        --python) PYVER="${2:?--python needs X.Y}"; shift 2 ;;
        --glibc) GLIBC="${2:?--glibc needs X.Y}"; shift 2 ;;
        --refresh) REFRESH=1; shift ;;
        --cpu) VARIANT=cpu; shift ;;
        --gpu) VARIANT=gpu; shift ;;
        --host-pip-config) ISOLATED=0; shift ;;
        --tensorflow) SET=tf; shift ;;
        -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) DIR="$1"; shift ;;
    esac
done
[[ -n "$DIR" ]] || die "usage: make-wheelhouse.sh DIR [--cpu | --gpu] [--tensorflow] [--python X.Y] [--glibc X.Y] [--host-pip-config] [--refresh]"
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || die "--python '$PYVER': expected 3.N"
[[ "$GLIBC" =~ ^2\.[0-9]+$ ]] || die "--glibc '$GLIBC': expected 2.N"

PY="$(command -v python3 || command -v python)" || die "no python3 on the host"
"$PY" -m pip --version >/dev/null 2>&1 || die "no pip for $PY on the host"

TAG="cp${PYVER/./}"
pip_opts=()
if [[ $VARIANT == gpu ]]; then
    REQS=("$HERE/requirements-gpu.txt" "$HERE/build-requirements.txt")
    HASHED=("$HERE/requirements.txt" "${REQS[@]}")
    [[ $ISOLATED == 0 ]] || { ISOLATED=1; pip_opts+=(--isolated); }
else
    REQS=("$HERE/requirements.txt" "$HERE/build-requirements.txt")
    HASHED=("${REQS[@]}")
    ISOLATED=0
fi
NODEPS=()
stamp_file=.stamp
if [[ $SET == tf ]]; then
    REQS=("$HERE/requirements-tf.txt")
    NODEPS=("$HERE/requirements-tf-nodeps.txt")
    HASHED=("${REQS[@]}" "${NODEPS[@]}")
    stamp_file=.stamp-tf
fi
# The base set's stamp reads as it always did (a wheelhouse made before the TensorFlow set existed stays valid).
what="$VARIANT"
[[ $SET == base ]] || what="$SET"
stamp="$(cat "${HASHED[@]}" | sha256sum | cut -c1-16)-$what-$TAG-glibc$GLIBC-isolated$ISOLATED"

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
exec 8>"$DIR.lock"
flock -w 900 8 || die "could not lock $DIR.lock within 900 s (another make-wheelhouse stuck?)"
if ((!REFRESH)) && [[ "$(cat "$DIR/$stamp_file" 2>/dev/null)" == "$stamp" ]]; then
    say "$DIR is up to date ($TAG, $(du -sh "$DIR" | cut -f1))"
    exit 0
fi

platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for ((minor = 17; minor <= ${GLIBC#2.}; minor++)); do
    platforms+=(--platform "manylinux_2_${minor}_x86_64")
done

say "pip download${pip_opts[*]:+ ${pip_opts[*]}} -> $DIR ($what, CPython $PYVER, manylinux x86_64 up to glibc $GLIBC)"
t0=$SECONDS
rm -f "$DIR/$stamp_file"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
download() {  # download [pip download args...]: the common options, pip's tail and one line on failure
    if ! "$PY" -m pip download "${pip_opts[@]}" --quiet --dest "$DIR" --only-binary=:all: \
            --implementation cp --python-version "$PYVER" --abi "$TAG" "${platforms[@]}" "$@" >"$log" 2>&1; then
        tail -n 15 "$log" >&2
        die "pip download failed for $TAG (see above)"
    fi
}
req_args=()
for r in "${REQS[@]}"; do req_args+=(-r "$r"); done
download "${req_args[@]}"
for r in "${NODEPS[@]}"; do download --no-deps -r "$r"; done
if [[ $SET == tf ]]; then
    for w in tensorflow_cpu tf_keras; do
        compgen -G "$DIR/$w-*.whl" >/dev/null || die "no $w wheel in $DIR after pip download"
    done
elif [[ $VARIANT == gpu ]]; then
    # A CPU torch here would give a GPU image without CUDA, silently: refuse it.
    if compgen -G "$DIR/torch-*+cpu*.whl" >/dev/null; then
        die "$DIR holds a CPU-only torch ($(cd "$DIR" && ls torch-*+cpu*.whl | head -n 1)); the GPU" \
            "wheelhouse needs PyPI's CUDA build (remove it; without --host-pip-config pip ignores the host config)"
    fi
    compgen -G "$DIR/nvidia_nccl*.whl" >/dev/null \
        || die "no nvidia-nccl wheel in $DIR: the torch that pip resolved is not PyPI's CUDA build"
fi
echo "$TAG" >"$DIR/PYTHON_TAG"
[[ $SET == tf ]] || echo "$VARIANT" >"$DIR/VARIANT"
echo "$stamp" >"$DIR/$stamp_file"
say "done in $((SECONDS - t0)) s: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1)"
