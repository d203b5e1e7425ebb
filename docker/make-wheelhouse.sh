#!/usr/bin/env bash
# make-wheelhouse.sh: download, on the host, every wheel the image installs, for the image's Python.
#
#   bash docker/make-wheelhouse.sh DIR [--python 3.11] [--glibc 2.35] [--refresh]
#
# What it owns: DIR, filled by `pip download` (binary wheels only, CPython X.Y, manylinux x86_64 up
# to the given glibc) with docker/requirements.txt and docker/build-requirements.txt, plus
# DIR/PYTHON_TAG (e.g. cp311, checked by the Dockerfile) and DIR/.stamp. A second run with the same
# requirements, Python and glibc finds the stamp and returns at once. torch comes from whatever
# the host's pip resolves for torch==2.13.0 (its config may point at a local CPU wheel).
# This is how images get built where containers cannot reach an index, and how air-gapped
# clusters get their wheelhouse (copy DIR there, then build.sh --wheelhouse DIR).
#
# Failure modes: pip's error (a package without a wheel for that Python, no index) ends in one
# "make-wheelhouse: ERROR: ..." line and a non-zero exit; DIR keeps what was downloaded, without
# a stamp.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYVER=3.11
GLIBC=2.35
REFRESH=0
DIR=""

say() { echo "make-wheelhouse: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

while (($#)); do
    case "$1" in
        --python) PYVER="${2:?--python needs X.Y}"; shift 2 ;;
        --glibc) GLIBC="${2:?--glibc needs X.Y}"; shift 2 ;;
        --refresh) REFRESH=1; shift ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) DIR="$1"; shift ;;
    esac
done
[[ -n "$DIR" ]] || die "usage: make-wheelhouse.sh DIR [--python X.Y] [--glibc X.Y] [--refresh]"
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || die "--python '$PYVER': expected 3.N"
[[ "$GLIBC" =~ ^2\.[0-9]+$ ]] || die "--glibc '$GLIBC': expected 2.N"

PY="$(command -v python3 || command -v python)" || die "no python3 on the host"
"$PY" -m pip --version >/dev/null 2>&1 || die "no pip for $PY on the host"

TAG="cp${PYVER/./}"
REQS=("$HERE/requirements.txt" "$HERE/build-requirements.txt")
stamp="$(cat "${REQS[@]}" | sha256sum | cut -c1-16)-$TAG-glibc$GLIBC"

mkdir -p "$DIR"
if ((!REFRESH)) && [[ "$(cat "$DIR/.stamp" 2>/dev/null)" == "$stamp" ]]; then
    say "$DIR is up to date ($TAG, $(du -sh "$DIR" | cut -f1))"
    exit 0
fi

platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for ((minor = 17; minor <= ${GLIBC#2.}; minor++)); do
    platforms+=(--platform "manylinux_2_${minor}_x86_64")
done

say "pip download -> $DIR (CPython $PYVER, manylinux x86_64 up to glibc $GLIBC)"
t0=$SECONDS
rm -f "$DIR/.stamp"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! "$PY" -m pip download --quiet --dest "$DIR" --only-binary=:all: \
        --implementation cp --python-version "$PYVER" --abi "$TAG" "${platforms[@]}" \
        -r "${REQS[0]}" -r "${REQS[1]}" >"$log" 2>&1; then
    tail -n 15 "$log" >&2
    die "pip download failed for $TAG (see above)"
fi
echo "$TAG" >"$DIR/PYTHON_TAG"
echo "$stamp" >"$DIR/.stamp"
say "done in $((SECONDS - t0)) s: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1)"
