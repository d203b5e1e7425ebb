#!/usr/bin/env bash
# build.sh: build the appliance image (OpenMPI, sshd, /opt/venv with torch, TensorFlow and appliance).
#
#   bash build.sh                      GPU image: PyPI's CUDA 13 torch 2.13.0 (+ CUDA runtime and
#                                      NCCL as nvidia-* wheels) and torchvision 0.28.0, on the
#                                      debootstrapped Debian base; runs on hosts without a GPU too
#   bash build.sh --cpu                CPU image: the same Python packages (PyPI's torchvision
#                                      needs the CUDA torch), without the NVIDIA toolkit's env
# Both carry tensorflow-cpu 2.21.0 and tf-keras 2.21.0 (one layer above torch's, shared by both
# variants) and appliance.tensorflow's op library, compiled in the build into
# /opt/appliance/tf-ops (APPLIANCE_TF_OPS_DIR); --no-tensorflow leaves them out (~1.4 GB less).
# Both start from appliance-base:bookworm (made with debootstrap when missing; no registry needed)
# and install Python packages from a wheelhouse made on the host (cached per Python, one for both
# variants: APPLIANCE_CACHE_DIR/wheelhouse-gpu-cpXY, ~2.7 GB, fetched from PyPI with pip
# --isolated; TensorFlow's set in APPLIANCE_CACHE_DIR/wheelhouse-tf-cpXY, ~320 MB). The wheelhouse is served to the build over HTTP on a loopback address (docker build --network host), so it is never in the build
# context or the image. First GPU build ~6 min (~5 min with the wheelhouse already made), then
# cached: ~2 s unchanged, ~11 s after a .py change; ~14 GB of free disk at the peak.
# Options:
#   --gpu | --cpu                      which variant (default --gpu)
#   --no-tensorflow                    without TensorFlow (torch only); --tensorflow: with (default)
#   --base IMAGE                       base image (default appliance-base:bookworm, made by
#                                      docker/bootstrap-base.sh); e.g. nvidia/cuda:13.0.0-base-ubuntu24.04
#                                      where a registry is reachable (its Python is 3.12: the
#                                      wheelhouse follows; Debian/Ubuntu bases with apt only)
#   --wheelhouse DIR                   install Python packages only from DIR (air-gapped; checked first;
#                                      with TensorFlow it must hold the TensorFlow set too)
#   --make-wheelhouse DIR              fill DIR with `pip download` on the host (both sets), then use it
#   --index                            install Python packages from the index inside the build
#                                      (also for a remote or rootless engine, which cannot reach the
#                                      host's loopback)
#   --python X.Y                       the base's Python, for the wheelhouse (default: detected)
#   --tag NAME                         image name (default appliance:gpu / appliance:cpu, and
#                                      appliance:latest is pointed at it)
#   --no-cache                         docker build --no-cache
#   -v | --verbose                     show the full docker build output (always in the log file)
#
# Env: APPLIANCE_CACHE_DIR (default ~/.cache/appliance: base rootfs, wheelhouses, build logs),
# APPLIANCE_WHEELHOUSE_PORT (default 47683: the port the wheelhouse is served on, on a random
# 127.x.y.z address). Uses the classic builder (DOCKER_BUILDKIT=0; BuildKit is not available
# everywhere). Failure modes: Docker missing or its daemon down, a base that cannot be made, an
# incomplete wheelhouse, a failing build: each is one "build.sh: ERROR: ..." line (a failing build
# also shows the end of its log) and a non-zero exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${APPLIANCE_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/appliance}"
DEFAULT_BASE="appliance-base:bookworm"
WH_PORT="${APPLIANCE_WHEELHOUSE_PORT:-47683}"

variant=gpu tensorflow=1 base="" wheelhouse="" make_wheelhouse="" pkg_mode="" pyver="" tag="" verbose=0
build_opts=()

say() { echo "build.sh: $*"; }
die() { echo "build.sh: ERROR: $*" >&2; exit 1; }

while (($#)); do
    case "$1" in
        --gpu) variant=gpu; shift ;;
        --cpu) variant=cpu; shift ;;
        --tensorflow) tensorflow=1; shift ;;
        --no-tensorflow) tensorflow=0; shift ;;
        --base) base="${2:?--base needs an image}"; shift 2 ;;
        --wheelhouse) wheelhouse="${2:?--wheelhouse needs a directory}"; pkg_mode=wheelhouse; shift 2 ;;
        --make-wheelhouse) make_wheelhouse="${2:?--make-wheelhouse needs a directory}"; pkg_mode=wheelhouse; shift 2 ;;
        --index) pkg_mode=index; shift ;;
        --python) pyver="${2:?--python needs X.Y}"; shift 2 ;;
        --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
        --no-cache) build_opts+=(--no-cache); shift ;;
        -v|--verbose) verbose=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
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

base="${base:-$DEFAULT_BASE}"
tag="${tag:-appliance:$variant}"
pkg_mode="${pkg_mode:-wheelhouse}"
[[ "$WH_PORT" =~ ^[0-9]+$ ]] && ((WH_PORT > 0 && WH_PORT < 65536)) \
    || die "APPLIANCE_WHEELHOUSE_PORT=$WH_PORT: expected a TCP port"
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

# 2. Python packages: a wheelhouse served to the build, or none (index mode).
build_opts+=(--target "$variant" --build-arg "TENSORFLOW=$tensorflow")
server_pid=""
stop_server() { [[ -z "$server_pid" ]] || kill "$server_pid" 2>/dev/null || true; }
trap stop_server EXIT
if [[ $pkg_mode == wheelhouse ]]; then
    if [[ -n "${DOCKER_HOST:-}" && "$DOCKER_HOST" != unix://* ]]; then
        die "DOCKER_HOST=$DOCKER_HOST: a remote engine cannot reach the wheelhouse served here; use --index"
    fi
    if [[ -z "$wheelhouse" ]]; then
        pyver="${pyver:-$(python_of_base)}" || die "cannot tell the Python of $base; pass --python X.Y"
        # One package set for both variants (see Dockerfile): the GPU wheelhouse.
        wheelhouse="${make_wheelhouse:-$CACHE/wheelhouse-gpu-cp${pyver/./}}"
        say "[2/4] wheelhouse: $wheelhouse (host pip, Python $pyver)"
        bash "$ROOT/docker/make-wheelhouse.sh" "$wheelhouse" --gpu --python "$pyver" \
            || die "could not make the wheelhouse $wheelhouse (see above)"
        if ((tensorflow)); then
            # TensorFlow's set in a folder of its own by default, so the torch layer's wheel list
            # (WHEELHOUSE_ID) and cache stay as they were; --make-wheelhouse DIR holds both.
            tf_wheelhouse="${make_wheelhouse:-$CACHE/wheelhouse-tf-cp${pyver/./}}"
            say "[2/4] wheelhouse: $tf_wheelhouse (TensorFlow's set)"
            bash "$ROOT/docker/make-wheelhouse.sh" "$tf_wheelhouse" --tensorflow --gpu --python "$pyver" \
                || die "could not make the TensorFlow wheelhouse $tf_wheelhouse (see above)"
        fi
    else
        [[ -d "$wheelhouse" ]] || die "--wheelhouse $wheelhouse: no such directory"
        compgen -G "$wheelhouse/*.whl" >/dev/null || die "--wheelhouse $wheelhouse holds no wheels"
        if ((tensorflow)); then
            compgen -G "$wheelhouse/tensorflow_cpu-*.whl" >/dev/null && compgen -G "$wheelhouse/tf_keras-*.whl" >/dev/null \
                || die "--wheelhouse $wheelhouse has no tensorflow_cpu or tf_keras wheel (add them: bash docker/make-wheelhouse.sh $wheelhouse --tensorflow; or build with --no-tensorflow)"
            tf_wheelhouse="$wheelhouse"
        fi
        say "[2/4] wheelhouse: $wheelhouse (given)"
    fi
    wheelhouse="$(cd "$wheelhouse" && pwd)"
    tf_wheelhouse="$(cd "${tf_wheelhouse:-$wheelhouse}" && pwd)"
    if compgen -G "$wheelhouse/torch-*+cpu*.whl" >/dev/null; then
        say "WARNING: the wheelhouse holds a CPU-only torch; the image will not use CUDA and PyPI's torchvision will not import"
    fi
    # Its identity for the layer cache: names and sizes of the wheels (a new wheel, a new build).
    wh_id="$(find "$wheelhouse" -maxdepth 1 -name '*.whl' -printf '%f %s\n' | LC_ALL=C sort | sha256sum | cut -c1-16)"
    tf_wh_id="$(find "$tf_wheelhouse" -maxdepth 1 -name '*.whl' -printf '%f %s\n' | LC_ALL=C sort | sha256sum | cut -c1-16)"
    wh_python="$(cat "$wheelhouse/PYTHON_TAG" 2>/dev/null || true)"
    # Serve it read-only on a random 127.x.y.z (loopback: nothing outside this machine sees it)
    # at a fixed port; the build reaches it as appliance-wheelhouse (--add-host), so neither the
    # address nor anything else that varies between builds enters the layer cache key.
    command -v python3 >/dev/null || die "python3 is needed on the host to serve the wheelhouse"
    addr_file="$(mktemp "${TMPDIR:-/tmp}/appliance-wheelhouse.XXXXXX")"
    # The wheelhouse at /, TensorFlow's set at /tf/ (the same folder when given one).
    python3 - "$wheelhouse" "$WH_PORT" "$addr_file" "$tf_wheelhouse" <<'PY' >>"$CACHE/logs/wheelhouse-server.log" 2>&1 &
import errno, functools, http.server, random, sys

root, port, addr_file, tf_root = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def translate_path(self, path):
        if path == "/tf" or path.startswith(("/tf/", "/tf?")):
            saved, self.directory = self.directory, tf_root
            try:
                return super().translate_path(path[3:] or "/")
            finally:
                self.directory = saved
        return super().translate_path(path)

    def do_PUT(self):  # read-only
        self.send_error(405)


for _ in range(50):
    addr = "127.%d.%d.%d" % (random.randint(1, 254), random.randint(0, 255), random.randint(1, 254))
    try:
        srv = http.server.ThreadingHTTPServer((addr, port), functools.partial(Handler, directory=root))
        break
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
else:
    sys.exit("port %d is in use on every loopback address tried (set APPLIANCE_WHEELHOUSE_PORT)" % port)
srv.daemon_threads = True
with open(addr_file, "w") as f:
    f.write(addr)
srv.serve_forever()
PY
    server_pid=$!
    for _ in $(seq 1 100); do
        [[ -s "$addr_file" ]] && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    wh_addr="$(cat "$addr_file" 2>/dev/null || true)"
    rm -f "$addr_file"
    [[ -n "$wh_addr" ]] || die "could not serve $wheelhouse (log: $CACHE/logs/wheelhouse-server.log)"
    build_opts+=(--network host --add-host "appliance-wheelhouse:$wh_addr"
                 --build-arg "WHEELHOUSE_URL=http://appliance-wheelhouse:$WH_PORT/"
                 --build-arg "WHEELHOUSE_ID=$wh_id" --build-arg "WHEELHOUSE_PYTHON=$wh_python")
    if ((tensorflow)); then
        build_opts+=(--build-arg "TF_WHEELHOUSE_URL=http://appliance-wheelhouse:$WH_PORT/tf/"
                     --build-arg "TF_WHEELHOUSE_ID=$tf_wh_id")
    fi
else
    say "[2/4] packages: from the index inside the build (no wheelhouse)"
fi

# 3. docker build (classic builder), progress = its Step lines; everything in the log.
old_id="$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)"
log="$CACHE/logs/build-${tag//[^A-Za-z0-9_.-]/_}.log"
say "[3/4] docker build -t $tag (base $base; log $log)"
t_build=$SECONDS
set +e
docker build --force-rm "${build_opts[@]}" --build-arg BASE_IMAGE="$base" --label "appliance.variant=$variant" \
    --label "appliance.tensorflow=$tensorflow" \
    --label "appliance.base=$base" -t "$tag" -f "$ROOT/Dockerfile" "$ROOT" 2>&1 \
    | tee "$log" \
    | if ((verbose)); then cat; else
        grep --line-buffered -E '^Step [0-9]+/[0-9]+ : ' | cut -c1-110 | sed -u 's/^/build.sh:       /'
      fi
status=${PIPESTATUS[0]}
set -e
stop_server
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
