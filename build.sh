#!/usr/bin/env bash
# build.sh: build the appliance image (OpenMPI, sshd, /opt/venv with torch and appliance).
#
#   bash build.sh                      GPU image from the NVIDIA CUDA base, packages from the index
#   bash build.sh --cpu                CPU image from a debootstrapped Debian base (made when missing),
#                                      packages from a wheelhouse made on the host (cached)
# Options:
#   --gpu | --cpu                      which variant (default --gpu)
#   --base IMAGE                       base image (default: CUDA devel for --gpu, appliance-base:bookworm
#                                      for --cpu; that one is made by docker/bootstrap-base.sh)
#   --wheelhouse DIR                   install Python packages only from DIR (air-gapped; checked first)
#   --make-wheelhouse DIR              fill DIR with `pip download` on the host, then use it
#   --index                            install Python packages from the index inside the build
#   --python X.Y                       the base's Python, for the wheelhouse (default: detected)
#   --tag NAME                         image name (default appliance:gpu / appliance:cpu, and
#                                      appliance:latest is pointed at it)
#   --no-cache                         docker build --no-cache
#   -v | --verbose                     show the full docker build output (always in the log file)
#
# Env: APPLIANCE_CACHE_DIR (default ~/.cache/appliance: base rootfs, wheelhouses, build logs).
# Uses the classic builder (DOCKER_BUILDKIT=0; BuildKit is not available everywhere). Failure
# modes: Docker missing or its daemon down, a base that cannot be made, an incomplete wheelhouse,
# a failing build: each is one "build.sh: ERROR: ..." line (a failing build also shows the end of
# its log) and a non-zero exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${APPLIANCE_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/appliance}"
GPU_BASE="nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
CPU_BASE="appliance-base:bookworm"

variant=gpu base="" wheelhouse="" make_wheelhouse="" pkg_mode="" pyver="" tag="" verbose=0
build_opts=()

say() { echo "build.sh: $*"; }
die() { echo "build.sh: ERROR: $*" >&2; exit 1; }

while (($#)); do
    case "$1" in
        --gpu) variant=gpu; shift ;;
        --cpu) variant=cpu; shift ;;
        --base) base="${2:?--base needs an image}"; shift 2 ;;
        --wheelhouse) wheelhouse="${2:?--wheelhouse needs a directory}"; pkg_mode=wheelhouse; shift 2 ;;
        --make-wheelhouse) make_wheelhouse="${2:?--make-wheelhouse needs a directory}"; pkg_mode=wheelhouse; shift 2 ;;
        --index) pkg_mode=index; shift ;;
        --python) pyver="${2:?--python needs X.Y}"; shift 2 ;;
        --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
        --no-cache) build_opts+=(--no-cache); shift ;;
        -v|--verbose) verbose=1; shift ;;
        -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see bash build.sh --help)" ;;
    esac
done
[[ -z "$wheelhouse" || -z "$make_wheelhouse" ]] || die "give --wheelhouse or --make-wheelhouse, not both"

command -v docker >/dev/null \
    || die "docker is not installed (Debian: apt-get install docker.io; or bash .ci/docker-up.sh)"
docker info >/dev/null 2>&1 \
    || die "the Docker daemon is not running or not reachable (start dockerd, or bash .ci/docker-up.sh)"
if [[ "${DOCKER_BUILDKIT:-0}" != 0 ]]; then
    say "note: DOCKER_BUILDKIT=$DOCKER_BUILDKIT ignored; this build uses the classic builder"
fi
export DOCKER_BUILDKIT=0

base="${base:-$([[ $variant == gpu ]] && echo "$GPU_BASE" || echo "$CPU_BASE")}"
tag="${tag:-appliance:$variant}"
pkg_mode="${pkg_mode:-$([[ $variant == gpu ]] && echo index || echo wheelhouse)}"
mkdir -p "$CACHE/logs"
t_start=$SECONDS

# 1. Base image.
if ! docker image inspect "$base" >/dev/null 2>&1; then
    if [[ "$base" == appliance-base:* ]]; then
        say "[1/4] base: $base missing; making it with debootstrap"
        bash "$ROOT/docker/bootstrap-base.sh" "$base" --cache "$CACHE" \
            || die "could not make the base image $base (see above)"
    else
        say "[1/4] base: $base is not local; docker build will pull it"
    fi
else
    say "[1/4] base: $base"
fi

# The base's Python (for the wheelhouse): asked of the image when local, else read off its tag.
python_of_base() {
    local os=""
    if docker image inspect "$base" >/dev/null 2>&1; then
        os="$(docker run --rm --entrypoint /bin/sh "$base" -c '. /etc/os-release; echo "$ID$VERSION_ID"' 2>/dev/null || true)"
    fi
    [[ -n "$os" ]] || os="$(grep -o -E '(ubuntu|debian)[0-9.]+' <<<"$base" | head -n 1 || true)"
    case "$os" in
        debian12*|*bookworm*) echo 3.11 ;;
        debian13*|*trixie*) echo 3.13 ;;
        ubuntu22.04) echo 3.10 ;;
        ubuntu24.04) echo 3.12 ;;
        *) return 1 ;;
    esac
}
[[ "$base" == appliance-base:bookworm ]] && pyver="${pyver:-3.11}"

# 2. Python packages: a wheelhouse staged into the build context, or none (index mode).
stage="$ROOT/.wheelhouse"
rm -rf "$stage"
mkdir -p "$stage"
if [[ $pkg_mode == wheelhouse ]]; then
    if [[ -z "$wheelhouse" ]]; then
        pyver="${pyver:-$(python_of_base)}" || die "cannot tell the Python of $base; pass --python X.Y"
        wheelhouse="${make_wheelhouse:-$CACHE/wheelhouse-cp${pyver/./}}"
        say "[2/4] wheelhouse: $wheelhouse (host pip, Python $pyver)"
        bash "$ROOT/docker/make-wheelhouse.sh" "$wheelhouse" --python "$pyver" \
            || die "could not make the wheelhouse $wheelhouse (see above)"
    else
        [[ -d "$wheelhouse" ]] || die "--wheelhouse $wheelhouse: no such directory"
        compgen -G "$wheelhouse/*.whl" >/dev/null || die "--wheelhouse $wheelhouse holds no wheels"
        say "[2/4] wheelhouse: $wheelhouse (given)"
    fi
    if [[ $variant == gpu ]] && compgen -G "$wheelhouse/torch-*+cpu-*.whl" >/dev/null; then
        say "WARNING: the wheelhouse holds a CPU-only torch; the GPU image will not use CUDA"
    fi
    # Hard links when the wheelhouse is on the same file system (instant), else a copy.
    cp -al "$wheelhouse/." "$stage/" 2>/dev/null || cp -a "$wheelhouse/." "$stage/"
    rm -f "$stage/.stamp"
    build_opts+=(--build-arg PIP_NO_INDEX=1)
else
    say "[2/4] packages: from the index inside the build (no wheelhouse)"
fi

# 3. docker build (classic builder), progress = its Step lines; everything in the log.
old_id="$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)"
log="$CACHE/logs/build-${tag//[^A-Za-z0-9_.-]/_}.log"
say "[3/4] docker build -t $tag (base $base; log $log)"
t_build=$SECONDS
set +e
docker build "${build_opts[@]}" --build-arg BASE_IMAGE="$base" --label "appliance.variant=$variant" \
    --label "appliance.base=$base" -t "$tag" -f "$ROOT/Dockerfile" "$ROOT" 2>&1 \
    | tee "$log" \
    | if ((verbose)); then cat; else
        grep --line-buffered -E '^Step [0-9]+/[0-9]+ : ' | cut -c1-110 | sed -u 's/^/build.sh:       /'
      fi
status=${PIPESTATUS[0]}
set -e
rm -rf "$stage"
if ((status != 0)); then
    echo "----- last lines of $log -----" >&2
    tail -n 30 "$log" >&2
    die "docker build failed (exit $status); full log: $log"
fi

# 4. Result.
if [[ "$tag" == "appliance:$variant" ]]; then
    docker tag "$tag" appliance:latest
fi
# The image this tag named before, if nothing else names or uses it now (its layers that the new
# image shares stay; the build cache of the other stages is kept).
new_id="$(docker image inspect -f '{{.Id}}' "$tag")"
if [[ -n "$old_id" && "$old_id" != "$new_id" ]] \
        && [[ "$(docker image inspect -f '{{len .RepoTags}}' "$old_id" 2>/dev/null)" == 0 ]]; then
    docker rmi "$old_id" >/dev/null 2>&1 || true
fi
size="$(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}')"
say "[4/4] built $tag ($size) in $((SECONDS - t_build)) s (total $((SECONDS - t_start)) s)"
echo "$tag"
