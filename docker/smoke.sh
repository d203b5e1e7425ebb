#!/usr/bin/env bash
# smoke.sh: quick checks of a built appliance image against a real Docker engine.
#
#   bash docker/smoke.sh [IMAGE]      (default appliance:latest)
#
# Checks: our C++ core and torch import from /opt/venv; mpirun is OpenMPI 4; `sshd -t` passes;
# no host keys, compilers or wheelhouse in the image; torch is a CUDA 13 build and torchvision
# imports with its C++ ops (both variants); for the GPU variant: libnccl.so.2 and libcudart.so.13
# load by name, the NVIDIA toolkit env is set, and without a GPU torch says CUDA is unavailable; two secondaries on a user-defined bridge
# network become healthy and SSH into each other on port 12345 with a fresh ed25519 cluster key
# (written to the share with loose modes on purpose: the entrypoint must fix them), a
# non-interactive session sees /opt/venv/bin on PATH, and sshd offers no method but public keys.
# What it owns: containers and a network named appliance-smoke-<pid>-*, and a temporary shared
# directory, all removed on exit (also on failure). Exit 0 when every check passed.
set -euo pipefail

IMAGE="${1:-appliance:latest}"
P="appliance-smoke-$$"
SHARE="$(mktemp -d /tmp/appliance-smoke.XXXXXX)"
passed=0 failed=0

cleanup() {
    docker rm -f "$P-a" "$P-b" >/dev/null 2>&1 || true
    docker network rm "$P-net" >/dev/null 2>&1 || true
    rm -rf "$SHARE"
}
trap cleanup EXIT

check() {  # check NAME CMD...: run CMD, count and report
    local name="$1"; shift
    if out="$("$@" 2>&1)"; then
        passed=$((passed + 1)); echo "ok    $name"
    else
        failed=$((failed + 1)); echo "FAIL  $name"; sed 's/^/      /' <<<"$out" | tail -n 8
    fi
}
in_image() { docker run --rm "$IMAGE" "$@"; }

docker image inspect "$IMAGE" >/dev/null 2>&1 || { echo "smoke: no image $IMAGE (run bash build.sh)"; exit 1; }

check "import appliance.runtime._core, torch" \
    in_image /opt/venv/bin/python -c "import appliance.runtime._core, torch"
check "mpirun is Open MPI 4" bash -c "docker run --rm '$IMAGE' mpirun --version | grep -q 'Open MPI) 4\.'"
check "sshd -t (the appliance's config)" in_image /usr/sbin/sshd -t -f /etc/ssh/sshd_config.appliance
check "no host keys in the image" bash -c \
    "! docker run --rm --entrypoint /bin/sh '$IMAGE' -c 'ls /etc/ssh/ssh_host_*' 2>/dev/null"
check "no wheelhouse in the image" bash -c \
    "docker run --rm --entrypoint /bin/sh '$IMAGE' -c 'test ! -e /wheelhouse'"
variant="$(docker image inspect -f '{{index .Config.Labels "appliance.variant"}}' "$IMAGE")"
if [[ "$(docker image inspect -f '{{index .Config.Labels "appliance.base"}}' "$IMAGE")" == appliance-base:* ]]; then
    check "no compilers in the image" bash -c \
        "docker run --rm --entrypoint /bin/sh '$IMAGE' -c '! command -v cc c++ gcc g++ cmake'"
fi
check "torch is a CUDA 13 build, torchvision imports with its C++ ops (both variants)" \
    in_image /opt/venv/bin/python -c "import torch, torchvision, torchvision.extension as e; assert torch.__version__.endswith('+cu130'), torch.__version__; assert torch.version.cuda.startswith('13.'); assert e._has_ops()"
if [[ "$variant" == gpu ]]; then
    check "libnccl.so.2, libcudart.so.13 load by name" \
        in_image /opt/venv/bin/python -c "import ctypes; ctypes.CDLL('libnccl.so.2'); ctypes.CDLL('libcudart.so.13')"
    check "NVIDIA toolkit env" bash -c \
        "docker image inspect -f '{{json .Config.Env}}' '$IMAGE' | grep -q '\"NVIDIA_VISIBLE_DEVICES=all\"' &&
         docker image inspect -f '{{json .Config.Env}}' '$IMAGE' | grep -q '\"NVIDIA_DRIVER_CAPABILITIES=compute,utility\"'"
    if ! docker info --format '{{json .Runtimes}}' | grep -q '"nvidia"'; then
        check "no GPU here: CUDA unavailable, CPU tensors work" \
            in_image /opt/venv/bin/python -c "import torch; assert not torch.cuda.is_available(); assert (torch.ones(2) * 2).sum().item() == 4"
    fi
fi

mkdir -p "$SHARE/ssh"
ssh-keygen -q -t ed25519 -N '' -C "$P" -f "$SHARE/ssh/id_ed25519"
cp "$SHARE/ssh/id_ed25519.pub" "$SHARE/ssh/authorized_keys"
chmod 0777 "$SHARE/ssh"; chmod 0666 "$SHARE/ssh/"*

docker network create "$P-net" >/dev/null
for h in a b; do
    docker run -d --init --name "$P-$h" --hostname "$P-$h" --network "$P-net" \
        -v "$SHARE:/mnt/share" "$IMAGE" secondary --port 12345 >/dev/null
done
healthy() {
    local h deadline=$((SECONDS + 40))
    for h in a b; do
        until [[ "$(docker inspect -f '{{.State.Health.Status}}' "$P-$h")" == healthy ]]; do
            ((SECONDS < deadline)) || { docker logs "$P-$h" 2>&1 | tail -n 5; return 1; }
            sleep 1
        done
    done
}
check "both secondaries healthy" healthy
check "ssh a -> b on 12345, PATH has the venv" bash -c \
    "docker exec '$P-a' ssh -p 12345 '$P-b' 'echo \$PATH; python -c \"import appliance.runtime._core\"' | grep -q /opt/venv/bin"
check "ssh b -> a on 12345" bash -c "[[ \"\$(docker exec '$P-b' ssh -p 12345 '$P-a' hostname)\" == '$P-a' ]]"
# The server itself must offer public keys only (a client-side refusal would prove nothing).
check "sshd offers publickey only" bash -c \
    "docker exec '$P-a' ssh -v -p 12345 -o PreferredAuthentications=none '$P-b' true 2>&1 \
     | tr -d '\r' | grep 'Authentications that can continue' | grep -q -E 'continue: publickey\$'"

echo "smoke: $IMAGE: $passed passed, $failed failed"
((failed == 0))
