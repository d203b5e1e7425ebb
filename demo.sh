#!/usr/bin/env bash
# The main job: train the default model (appliance/examples/train.py; with --keras the Keras
# example, appliance/examples/train_keras.py) data-parallel across a simulated 2-host cluster on
# this machine, the way a real cluster runs it:
#
#   1. Docker: started when it is not running (as root: bash .ci/docker-up.sh installs it if needed)
#   2. the `appliance` command in .venv (first run only; compiles the C++ core)
#   3. the image, via build.sh (then cached: seconds): the GPU image appliance:gpu when `docker info`
#      lists an nvidia runtime (the containers then get the GPUs), else the CPU image appliance:cpu
#      (smaller and faster to make: first run ~4 min, against ~6 min and 5.5 GB for the GPU one)
#   4. appliance secondary --name node2 --network appliance-demo      (sshd container "node2")
#   5. appliance primary -np 2 -H localhost:1,node2:1 --network appliance-demo -- python -m train
#      (--keras: python -m train_keras; rank 0 in the primary container, rank 1 in node2; the
#      checkpoint lands in the share)
#   6. the secondary and the network are removed at the end (--keep leaves them for `appliance status`)
#
#   bash demo.sh                         # as above
#   bash demo.sh -- --epochs 20          # arguments after -- go to the training job
#   bash demo.sh --elastic               # elastic: secondaries node2 and node3 register on the share;
#                                        # appliance primary -np 2 --min-np 1 --max-np 2 (no -H) trains
#                                        # on them; after epoch 2 node2 leaves (appliance secondary
#                                        # --stop), then node4 starts and joins; the job goes on to the end
#   bash demo.sh --local                 # no Docker: 2 ranks of this machine (appliance launch)
#   bash demo.sh --keras                 # the Keras example job instead (python -m train_keras: Keras fit
#                                        # with horovod.tensorflow.keras; checkpoint in models/digits-keras);
#                                        # also with --local (which then installs TensorFlow into .venv)
#   bash demo.sh --gpu | --cpu           # that image whatever the engine has (the GPU image also
#                                        # runs without a GPU, on CPU tensors)
#
# Env: APPLIANCE_IMAGE (default: appliance:gpu or appliance:cpu as above, built; another name is
# used as it is), APPLIANCE_DEMO_SHARED (default .demo/share here: the shared directory,
# mounted at the same path in every container).
set -euo pipefail
cd "$(dirname "$0")"
say() { printf '\033[1m[demo]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1m[demo]\033[0m ERROR: %s\n' "$*" >&2; exit 1; }

local_mode=0 keep=0 elastic=0 keras=0 variant="" train_args=()
while (($#)); do
  case "$1" in
    --local) local_mode=1; shift ;;
    --elastic) elastic=1; shift ;;
    --keras) keras=1; shift ;;
    --keep) keep=1; shift ;;
    --gpu) variant=gpu; shift ;;
    --cpu) variant=cpu; shift ;;
    --) shift; train_args=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see bash demo.sh --help)" ;;
  esac
done

PY=${PYTHON:-python3}
extras="" need="import appliance.cli, docker, rich, fabric, paramiko"
# The demo trains from scratch each time (the default job resumes a run's checkpoint otherwise);
# arguments after -- replace this. The elastic demo's steps take 0.2 s (--step-time), so that
# the cluster can change while it trains.
# The Keras job always trains from scratch (it takes no --fresh).
job=train run=digits ckpt=checkpoint.pt
((keras)) && job=train_keras run=digits-keras ckpt=checkpoint.keras
if ((!${#train_args[@]} && !keras)); then
  train_args=(--fresh)
  ((elastic)) && train_args+=(--step-time 0.2)
fi
((elastic && local_mode)) && die "--elastic needs Docker (it starts and stops secondary containers): drop --local"
((elastic && keras)) && die "--keras runs a static job (the Keras example is not elastic): drop --elastic"
if ((local_mode)); then
  extras="[train]" need="import appliance.runtime._core, torch, sklearn"
  ((keras)) && extras="[train,tensorflow]" need="import appliance.runtime._core, tensorflow, sklearn"
fi
if [ ! -x .venv/bin/appliance ] || ! .venv/bin/python -c "$need" 2>/dev/null; then
  say "installing the project into .venv (first run only; compiles the C++ core)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".$extras"
fi

if ((local_mode)); then
  say "appliance launch -np 2 -H localhost:2 -- python -m appliance.examples.$job ${train_args[*]}"
  exec .venv/bin/appliance launch -np 2 -H localhost:2 -- .venv/bin/python -m "appliance.examples.$job" "${train_args[@]}"
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    say "no Docker engine answers: starting one (bash .ci/docker-up.sh)"
    bash .ci/docker-up.sh
  else
    die "no Docker engine answers: start Docker (sudo systemctl start docker, or sudo bash .ci/docker-up.sh) and make sure you may use it"
  fi
fi

why="--$variant"
case "${APPLIANCE_IMAGE:-}" in appliance:gpu|appliance:cpu) variant="${APPLIANCE_IMAGE#appliance:}" why="APPLIANCE_IMAGE" ;; esac
if [ -z "$variant" ]; then
  if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"nvidia"'; then
    variant=gpu why="Docker has an nvidia runtime"
  else
    variant=cpu why="no nvidia runtime in Docker"
  fi
fi
IMAGE="${APPLIANCE_IMAGE:-appliance:$variant}"
if [ "$IMAGE" = "appliance:$variant" ]; then
  # Always through build.sh: the first time it makes everything (Debian base, wheelhouse,
  # compile); later Docker's layer cache makes it seconds, and the image never lags behind this
  # checkout.
  if [ "$variant" = gpu ]; then
    say "bash build.sh --gpu ($why; first time ~6 min, then cached)"
  else
    say "bash build.sh --cpu ($why; first time ~4 min, then cached)"
  fi
  bash build.sh "--$variant" >/dev/null
elif ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  die "image $IMAGE not found (build it with bash build.sh, or unset APPLIANCE_IMAGE)"
fi

SHARE="${APPLIANCE_DEMO_SHARED:-$PWD/.demo/share}"
mkdir -p "$SHARE"
NET=appliance-demo
cli=(.venv/bin/appliance)
common=(--image "$IMAGE" --shared "$SHARE" --network "$NET")
nodes=(node2)
((elastic)) && nodes=(node2 node3 node4)
cleanup() {
  local node
  if ((keep)); then
    say "kept: the secondaries on $NET (appliance status; remove each with: .venv/bin/appliance secondary --stop --name NODE --network $NET --shared $SHARE)"
  else
    for node in "${nodes[@]}"; do
      "${cli[@]}" secondary --stop --name "$node" "${common[@]}" >/dev/null 2>&1 || true
    done
  fi
}
trap cleanup EXIT

if ((elastic)); then
  # The job's output also goes to a log, which this script watches to change the cluster.
  log="$(mktemp -t appliance-demo.XXXXXX)"
  trap 'cleanup; rm -f "$log"' EXIT
  until_line() {  # until_line PATTERN: wait (at most 300 s) for PATTERN in the job's output
    local end=$((SECONDS + 300))
    until grep -q -- "$1" "$log"; do
      kill -0 "$job" 2>/dev/null || die "the job ended before '$1' (see its output above)"
      ((SECONDS < end)) || die "no '$1' in the job's output within 300 s"
      sleep 0.2
    done
  }
  for node in node2 node3; do
    say "appliance secondary --name $node --network $NET --shared $SHARE   (it registers on the share)"
    "${cli[@]}" secondary --name "$node" "${common[@]}"
  done
  say "appliance primary -np 2 --min-np 1 --max-np 2 --network $NET -- python -m train ${train_args[*]}"
  say "  (no -H: the hosts are the secondaries registered in $SHARE/secondaries)"
  "${cli[@]}" primary -np 2 --min-np 1 --max-np 2 "${common[@]}" -- python -m train "${train_args[@]}" \
    > >(tee -a "$log") 2> >(tee -a "$log" >&2) &
  job=$!
  until_line "epoch 2/"
  say "node2 leaves: appliance secondary --stop --name node2 (unregistered first: its rank leaves at the next commit)"
  "${cli[@]}" secondary --stop --name node2 "${common[@]}"
  say "node4 joins: appliance secondary --name node4 (its rank joins at the next commit)"
  "${cli[@]}" secondary --name node4 "${common[@]}"
  set +e
  wait "$job"
  rc=$?
  set -e
  if ((rc == 0)); then
    grep -q "cpu@node4" "$log" || die "the job finished before node4 joined (see its output above)"
    say "done: the job went on through node2 leaving and node4 joining; checkpoint $SHARE/models/digits/checkpoint.pt"
  fi
  exit $rc
fi

say "appliance secondary --name node2 --network $NET --shared $SHARE"
"${cli[@]}" secondary --name node2 "${common[@]}"
say "appliance primary -np 2 -H localhost:1,node2:1 --network $NET -- python -m $job ${train_args[*]}"
set +e
"${cli[@]}" primary -np 2 -H localhost:1,node2:1 "${common[@]}" -- python -m "$job" "${train_args[@]}"
rc=$?
set -e
if ((rc == 0)); then
  say "done: checkpoint $SHARE/models/$run/$ckpt, job records in $SHARE/jobs/"
fi
exit $rc
