# The appliance image: OpenMPI + sshd + /opt/venv (torch, TensorFlow, appliance with its C++ core).
#
# Build it with build.sh: it makes the base and the wheelhouse when missing and serves the
# wheelhouse to the build (see "Wheelhouse" below). Plain `docker build .` also works once the
# base exists (bash docker/bootstrap-base.sh) and then installs Python packages from the index.
# Classic builder only: no BuildKit syntax, no RUN --mount (DOCKER_BUILDKIT unset or 0).
#
# Variants (one Dockerfile, the final stage picks): --target gpu (the default, last stage) and
# --target cpu. Both carry the same Python packages, /opt/venv from one `venv` stage (so building
# both keeps its big layer once):
#   PyPI's torch==2.13.0 (CUDA 13.0 build: the CUDA runtime, cuDNN, cuBLAS and NCCL arrive as
#   nvidia-* wheels in /opt/venv, so any glibc >= 2.28 base works, no CUDA base needed) and
#   torchvision==0.28.0 (PyPI's only build, which needs CUDA torch's libraries: it does not import
#   beside a CPU-only torch). Without a GPU it runs on CPU tensors (torch.cuda.is_available() is
#   False). The wheels' library dirs are in /etc/ld.so.conf.d, so libnccl.so.2 and libcudart.so.13
#   load by name (a dlopen without torch's RPATH). ~5.5 GB.
#   TensorFlow (TENSORFLOW=1, build.sh's default; build.sh --no-tensorflow passes 0): tensorflow-cpu
#   2.21.0 and tf-keras 2.21.0 in a layer of their own above torch's (~1.2 GB), the same in both
#   variants, and appliance.tensorflow's op library compiled in stage tfops into
#   APPLIANCE_TF_OPS_DIR=/opt/appliance/tf-ops (read-only for every user, mpiuser too), so ranks
#   never compile. tensorflow-cpu in the GPU image too: our TF ops work on host tensors, and
#   TensorFlow's own GPU build would add its CUDA 12 wheels beside torch's CUDA 13 (docker/README.md).
#   gpu  adds NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=compute,utility for the NVIDIA
#        container toolkit (`docker run --gpus all`; the host driver must support CUDA 13, i.e.
#        R580 or newer).
#   cpu  without them.
#
# Stages:  os       BASE_IMAGE + runtime packages (python3, OpenMPI, OpenSSH), shared by all
#          venv     os + /opt/venv with the dependencies (binary wheels only: no compilers needed),
#                   torch's layer, then TensorFlow's
#          tfops    venv + g++ + the TF op library's C++ sources -> the compiled op library (keyed
#                   on those sources: a .py change does not recompile it)
#          builder  os + compilers, cmake + our sources -> our wheel, the C++ core compiled here
#                   (the same for both variants: the second build gets it from the cache)
#          runtime  venv + config + our wheel; no compilers, no wheelhouse
#          cpu|gpu  runtime + the variant's labels/env
# The venv is installed once, in a stage the runtime builds on (not copied between stages), so
# the big layer exists once on disk. Layer order follows change frequency: packages, dependency
# venv, then C++ sources (compiled once in a layer of their own), then Python sources, so a .py
# change rebuilds in seconds.
#
# Wheelhouse: build.sh serves a host directory of wheels over HTTP on a loopback address of the
# host and runs `docker build --network host --add-host appliance-wheelhouse:ADDR` with
# WHEELHOUSE_URL=http://appliance-wheelhouse:PORT/, so pip in the build installs from there with
# --no-index. The wheels never enter the build context (which stays ~1 MB) nor any layer.
# WHEELHOUSE_ID (a digest of the wheel list) invalidates the venv layer when the wheels change;
# the address does not touch the cache key. A remote or rootless engine cannot reach the host's
# loopback: use index mode (no WHEELHOUSE_URL) there.
#
# Build args: BASE_IMAGE (default appliance-base:bookworm, made by docker/bootstrap-base.sh; an
# Ubuntu/Debian image with apt, e.g. nvidia/cuda:13.0.0-base-ubuntu24.04, also works),
# OPENMPI_MAJOR (the build fails if the distro's OpenMPI has another major),
# WHEELHOUSE_ID / WHEELHOUSE_PYTHON / WHEELHOUSE_URL (set by build.sh), TENSORFLOW (1 or 0),
# TF_WHEELHOUSE_ID / TF_WHEELHOUSE_URL (the TensorFlow set's wheelhouse, set by build.sh),
# PIP_INDEX_URL and PIP_EXTRA_INDEX_URL (index mode).

ARG BASE_IMAGE=appliance-base:bookworm
# ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS os
ARG OPENMPI_MAJOR=4
ARG DEBIAN_FRONTEND=noninteractive
ENV LANG=C.UTF-8
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends \
        python3 python3-venv \
        openmpi-bin \
        openssh-server openssh-client \
        ca-certificates netbase hostname procps iproute2; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    ompi="$(mpirun --allow-run-as-root --version 2>&1 | sed -n 's/.*(Open MPI) \([0-9][0-9.]*\).*/\1/p' | head -n 1)"; \
    case "$ompi" in \
        "${OPENMPI_MAJOR}".*) ;; \
        *) echo "OpenMPI ${ompi:-not found} in the base's distro, but OPENMPI_MAJOR=${OPENMPI_MAJOR}" >&2; exit 1 ;; \
    esac; \
    mkdir -p /etc/appliance; \
    { echo "openmpi=$ompi"; \
      echo "python=$(python3 -c 'import platform; print(platform.python_version())')"; \
      echo "openssh=$(dpkg-query -W -f '${Version}' openssh-server)"; \
      . /etc/os-release; echo "os=$ID $VERSION_ID"; } > /etc/appliance/versions; \
    cat /etc/appliance/versions

# ---------------------------------------------------------------------------------------------
# Dependencies. docker/pip-install.sh VENV ARGS...: pip install into VENV from the wheelhouse (when
# build.sh serves one) or the index; it checks the wheelhouse's Python tag and that it answers.
# The nvidia-* wheels' library dirs go into /etc/ld.so.conf.d, so libnccl.so.2 and
# libcudart.so.13 load by name (a dlopen without torch's RPATH); never a driver library (libcuda,
# libnvidia-ml): those come from the host through the NVIDIA container toolkit.
FROM os AS venv
ARG WHEELHOUSE_ID
ARG WHEELHOUSE_PYTHON
ARG WHEELHOUSE_URL
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
COPY docker/pip-install.sh /usr/local/lib/appliance/pip-install
COPY docker/requirements.txt docker/requirements-gpu.txt /tmp/req/
RUN set -eu; \
    req=/tmp/req/requirements-gpu.txt; \
    chmod 0755 /usr/local/lib/appliance/pip-install; \
    python3 -m venv /opt/venv; \
    /usr/local/lib/appliance/pip-install /opt/venv -r "$req"; \
    rm -rf /tmp/req; \
    /opt/venv/bin/pip check; \
    dirs="$(find /opt/venv/lib/python3*/site-packages/nvidia -mindepth 2 -maxdepth 2 -type d -name lib 2>/dev/null | sort)"; \
    if [ -n "$dirs" ]; then \
        if find $dirs -name 'libcuda.so*' -o -name 'libnvidia-ml.so*' | grep -q .; then \
            echo "a driver library in the nvidia wheels: refusing to put it on the loader path" >&2; exit 1; \
        fi; \
        echo "$dirs" > /etc/ld.so.conf.d/appliance-nvidia.conf; \
        ldconfig; \
        ldconfig -p | grep -q 'libnccl.so.2 ' || { echo "libnccl.so.2 not on the loader path" >&2; exit 1; }; \
    fi; \
    /opt/venv/bin/python -c 'import importlib.metadata as m, torch; \
print("torch=" + torch.__version__); print("cuda=" + (torch.version.cuda or "none")); \
v = [d.version for d in m.distributions() if (d.metadata["Name"] or "").startswith("nvidia-nccl")]; \
print("nccl=" + (v[0] if v else "none")); \
print("torchvision=" + next((d.version for d in m.distributions() if d.metadata["Name"] == "torchvision"), "none"))' \
        >> /etc/appliance/versions; \
    cat /etc/appliance/versions

# TensorFlow: a layer of its own above torch's (its ARGs are declared here, so torch's layer keeps
# its cache key whether TensorFlow is in or out); TENSORFLOW=0 leaves it empty. tf-keras goes in
# with --no-deps (it declares `tensorflow`, the module tensorflow-cpu installs under another name),
# and docker/pip-check.sh accepts exactly that one line of pip check.
ARG TENSORFLOW=1
ARG TF_WHEELHOUSE_ID
ARG TF_WHEELHOUSE_URL
COPY docker/pip-check.sh /usr/local/lib/appliance/pip-check
COPY docker/requirements-tf.txt docker/requirements-tf-nodeps.txt /tmp/req/
RUN set -eu; \
    chmod 0755 /usr/local/lib/appliance/pip-check; \
    if [ "$TENSORFLOW" = 1 ]; then \
        if [ -n "$TF_WHEELHOUSE_URL" ]; then export WHEELHOUSE_URL="$TF_WHEELHOUSE_URL"; fi; \
        /usr/local/lib/appliance/pip-install /opt/venv -r /tmp/req/requirements-tf.txt; \
        /usr/local/lib/appliance/pip-install /opt/venv --no-deps -r /tmp/req/requirements-tf-nodeps.txt; \
        TF_CPP_MIN_LOG_LEVEL=3 /opt/venv/bin/python -c 'import tensorflow as tf, tf_keras; \
print("tensorflow=" + tf.__version__); print("tf_keras=" + tf_keras.__version__)' >> /etc/appliance/versions; \
    elif [ "$TENSORFLOW" != 0 ]; then \
        echo "TENSORFLOW=$TENSORFLOW: expected 1 or 0" >&2; exit 1; \
    fi; \
    rm -rf /tmp/req; \
    /usr/local/lib/appliance/pip-check /opt/venv; \
    cat /etc/appliance/versions

# ---------------------------------------------------------------------------------------------
# appliance.tensorflow's op library, compiled against /opt/venv's TensorFlow (its headers and
# flags are found at the same path in the image) from its C++ sources and _library.py alone
# (docker/build-tf-ops.py stands in for the rest of the package): a .py change elsewhere keeps
# this stage cached. The runtime stage copies /opt/appliance/tf-ops and checks, with the wheel
# installed and no compiler, that appliance.tensorflow finds it. TENSORFLOW=0: an empty folder.
FROM venv AS tfops
ARG DEBIAN_FRONTEND=noninteractive
ARG TENSORFLOW=1
RUN set -eux; \
    if [ "$TENSORFLOW" = 1 ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends g++; \
        rm -rf /var/lib/apt/lists/*; \
    fi
COPY docker/build-tf-ops.py /src/build-tf-ops.py
COPY appliance/tensorflow/_library.py /src/appliance/tensorflow/_library.py
COPY appliance/tensorflow/csrc/ /src/appliance/tensorflow/csrc/
COPY appliance/runtime/csrc/capi/appliance_core.h /src/appliance/runtime/csrc/capi/appliance_core.h
RUN set -eu; \
    mkdir -p /opt/appliance/tf-ops; \
    if [ "$TENSORFLOW" = 1 ]; then \
        cd /src; \
        APPLIANCE_TF_OPS_DIR=/opt/appliance/tf-ops TF_CPP_MIN_LOG_LEVEL=3 /opt/venv/bin/python /src/build-tf-ops.py /src; \
        find /opt/appliance/tf-ops -name .lock -delete; \
    fi; \
    chmod -R a+rX,go-w /opt/appliance/tf-ops; \
    ls -lR /opt/appliance/tf-ops

# ---------------------------------------------------------------------------------------------
# Our wheel, in a stage of its own FROM os: it needs no dependency of /opt/venv, so a change of
# requirements does not recompile the core, and the CPU and GPU variants share this whole stage
# through the layer cache (the second variant's build skips it). Its build backend venv depends
# on build-requirements.txt only (not WHEELHOUSE_ID).
FROM os AS builder
ARG DEBIAN_FRONTEND=noninteractive
ARG WHEELHOUSE_PYTHON
ARG WHEELHOUSE_URL
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends g++ make cmake ninja-build python3-dev; \
    rm -rf /var/lib/apt/lists/*
COPY docker/pip-install.sh /usr/local/lib/appliance/pip-install
COPY docker/build-requirements.txt /tmp/req/
RUN set -eu; \
    python3 -m venv /opt/buildenv; \
    /usr/local/lib/appliance/pip-install /opt/buildenv -r /tmp/req/build-requirements.txt; \
    rm -rf /tmp/req

# C++ first: compile the core from the C++ inputs alone into the persistent build dir
# (pyproject's build-dir), so a later change to Python files finds the objects up to date.
# README.md is a placeholder here (metadata needs one); the real one comes with the sources.
# If the C++ build grows inputs outside these paths, add them here; until then the full build
# below still works, it just compiles from scratch. The C++ sources get one fixed old mtime before
# both builds: COPY keeps the mtimes of the checkout, so a cached pre-build made from another
# checkout (CI's fresh clone, a branch switch) would otherwise look older than the sources and
# everything would recompile. Safe: the second COPY of csrc/ has the content the pre-build compiled
# (both COPYs are keyed on content), and ninja's depfiles cover the headers.
WORKDIR /src
COPY pyproject.toml CMakeLists.txt ./
COPY appliance/runtime/csrc/ appliance/runtime/csrc/
RUN touch README.md; \
    find appliance/runtime/csrc -exec touch -h -d @946684800 {} +; \
    /opt/buildenv/bin/pip wheel -q --no-deps --no-build-isolation -w /tmp/prebuild . \
    || echo "builder: the C++-only pre-build failed; the full build compiles from scratch" >&2; \
    rm -rf /tmp/prebuild

COPY README.md ./
COPY appliance/ appliance/
RUN set -eux; \
    find appliance/runtime/csrc -exec touch -h -d @946684800 {} +; \
    /opt/buildenv/bin/pip wheel --no-deps --no-build-isolation -w /dist . ; \
    ls -l /dist

# ---------------------------------------------------------------------------------------------
FROM venv AS runtime
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none \
    APPLIANCE_SHARED=/mnt/share \
    APPLIANCE_TF_OPS_DIR=/opt/appliance/tf-ops
# No APPLIANCE_SSH_PORT here: the launcher takes it as the other hosts' port, and in Kubernetes
# that is /etc/ssh/ssh_config's 2222. The appliance's containers get it from their entrypoint
# (default 12345) or `appliance secondary|primary`.

# Two worlds, one image. The appliance: appliance-entrypoint runs sshd with sshd_config.appliance on
# --ssh-port (12345), keys from the share. Kubernetes (MPI Operator, Kubeflow Trainer; no entrypoint
# runs there): root's `/usr/sbin/sshd -De` reads /etc/ssh/sshd_config, mpiuser's (uid 1000, as the
# operators' images) `sshd -De -f /home/mpiuser/.sshd_config`; both listen on 2222 with the mounted
# id_rsa as host key, and /etc/ssh/ssh_config gives clients port 2222 and no known_hosts.
COPY docker/sshd_config /etc/ssh/sshd_config.appliance
COPY docker/sshd_config.operator /etc/ssh/sshd_config
COPY docker/sshd_config.mpiuser /usr/local/lib/appliance/mpiuser-sshd_config
COPY docker/ssh_config.operator /etc/ssh/ssh_config
COPY docker/ssh_config /etc/ssh/ssh_config.d/appliance.conf
COPY docker/entrypoint.sh /usr/local/bin/appliance-entrypoint
COPY docker/healthcheck.sh /usr/local/bin/appliance-healthcheck
# No host keys in the image (each container makes its own, or takes the cluster's from the share);
# pam_loginuid cannot work in a container; env for SSH sessions (Docker ENV is not visible there):
# /etc/environment through PAM for root's sshd, mpiuser's .sshd_config SetEnv for the non-root one.
# mpiuser's password field is '*' (no password, not "locked": sshd refuses key logins to a locked
# account when it can read the shadow file).
RUN set -eux; \
    chmod 0755 /usr/local/bin/appliance-entrypoint /usr/local/bin/appliance-healthcheck; \
    chmod 0644 /etc/ssh/sshd_config /etc/ssh/sshd_config.appliance /etc/ssh/ssh_config \
        /etc/ssh/ssh_config.d/appliance.conf /usr/local/lib/appliance/mpiuser-sshd_config; \
    rm -f /etc/ssh/ssh_host_*; \
    mkdir -p /run/sshd /root/.ssh; chmod 0755 /run/sshd; chmod 0700 /root /root/.ssh; \
    sed -i 's/^session\s\+required\s\+pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd; \
    useradd --create-home --uid 1000 --user-group --shell /bin/bash mpiuser; \
    usermod -p '*' mpiuser; \
    appliance-entrypoint write-env; \
    test -s /home/mpiuser/.sshd_config

# The TensorFlow op library (empty without TensorFlow), before our wheel: it changes with its C++
# sources only.
COPY --from=tfops /opt/appliance/tf-ops/ /opt/appliance/tf-ops/

# Our wheel last: only this layer changes with our sources.
COPY --from=builder /dist/ /tmp/dist/
RUN set -eux; \
    /opt/venv/bin/pip install -q --no-index --no-deps --no-cache-dir /tmp/dist/appliance-*.whl; \
    rm -rf /tmp/dist; \
    /usr/local/lib/appliance/pip-check /opt/venv; \
    /opt/venv/bin/python -c "import appliance.runtime._core"; \
    echo "appliance=$(/opt/venv/bin/python -c 'import importlib.metadata as m; print(m.version("appliance"))')" \
        >> /etc/appliance/versions

# Not in the wheel: the `horovod` compatibility package (shim/, `import horovod.torch as hvd` is
# appliance.torch), installed by shim/install_horovod.py as outside the image (behind
# site-packages via a .pth, never shadowing a real Horovod), docker/train.py (`python -m
# train`: the default job unless the working directory has a train.py) and its Keras twin
# docker/train_keras.py (`python -m train_keras`). `horovodrun` is our
# wheel's console script. With TensorFlow, `import horovod.tensorflow` is appliance.tensorflow, and
# the op library it looks for under its key is the one stage tfops compiled (there is no compiler
# here to make another: a mismatch fails the build); one TensorFlow import (~4 s) checks both.
COPY shim/ /tmp/shim/
COPY docker/train.py docker/train_keras.py /tmp/jobs/
RUN set -eux; \
    site="$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
    mv /tmp/jobs/train.py /tmp/jobs/train_keras.py "$site/"; rmdir /tmp/jobs; \
    /opt/venv/bin/python /tmp/shim/install_horovod.py --target "$site"; \
    rm -rf /tmp/shim; \
    cd /; /opt/venv/bin/python -c "import appliance.cluster.jobrun, train, train_keras, horovod.torch as hvd, appliance.torch as a; assert hvd is a and hvd.init is a.init"; \
    /opt/venv/bin/python -c "import horovod, horovod.common.exceptions, horovod.common.util, horovod.runner.util.threads, horovod.torch.mpi_ops as m; assert horovod.__version__ == '0.28.1' and m.Compression"; \
    if [ "$(ls -A /opt/appliance/tf-ops)" ]; then \
        TF_CPP_MIN_LOG_LEVEL=3 /opt/venv/bin/python -c "import horovod.tensorflow as hvd, appliance.tensorflow as a; \
from appliance.tensorflow import _library; assert hvd is a and hvd.init is a.init; print(_library.build())" \
        || { echo "horovod.tensorflow does not import, or its op library is not the one stage tfops compiled" >&2; exit 1; }; \
    fi; \
    /opt/venv/bin/horovodrun --help >/dev/null

EXPOSE 12345 2222
HEALTHCHECK --interval=5s --timeout=4s --start-period=15s --retries=3 \
    CMD ["/usr/local/bin/appliance-healthcheck"]
ENTRYPOINT ["/usr/local/bin/appliance-entrypoint"]
CMD ["secondary"]

# ---------------------------------------------------------------------------------------------
FROM runtime AS cpu

# ---------------------------------------------------------------------------------------------
# The default (last) stage. The NVIDIA container toolkit reads these (`docker run --gpus all`, or
# the nvidia runtime); on a host without it they do nothing and CUDA is simply unavailable.
FROM runtime AS gpu
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN appliance-entrypoint write-env
