# The appliance image: OpenMPI + sshd + /opt/venv (torch, appliance with its C++ core).
#
# Build it with build.sh (it stages the wheelhouse and picks the base); plain `docker build .`
# also works and then installs Python packages from the index. Classic builder only: no BuildKit
# syntax, no RUN --mount (DOCKER_BUILDKIT unset or 0).
#
# Stages:  os       BASE_IMAGE + runtime packages (python3, OpenMPI, OpenSSH), shared by all
#          deps     + compilers, cmake; /opt/venv with the dependencies (from the wheelhouse or index)
#          builder  deps + our sources -> our wheel, the C++ core compiled here
#          runtime  os + /opt/venv from deps + our wheel; no compilers added, no wheelhouse
# Layer order follows change frequency: packages, dependency venv, then C++ sources (compiled once
# in a layer of their own), then Python sources, so a .py change rebuilds in seconds.
#
# Build args: BASE_IMAGE (default an NVIDIA CUDA devel image with NCCL; build.sh --cpu passes a
# debootstrapped Debian), OPENMPI_MAJOR (the build fails if the distro's OpenMPI has another major),
# PIP_NO_INDEX=1 (install only from the wheelhouse in .wheelhouse/), PIP_INDEX_URL and
# PIP_EXTRA_INDEX_URL (index mode, e.g. PyTorch's CPU index for a smaller CPU image).

ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04

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
FROM os AS deps
ARG DEBIAN_FRONTEND=noninteractive
ARG PIP_NO_INDEX=0
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/wheelhouse PIP_NO_CACHE_DIR=1
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends g++ make cmake ninja-build python3-dev; \
    rm -rf /var/lib/apt/lists/*

# The wheelhouse (may be empty in index mode; the [e] glob keeps COPY happy when it is absent).
COPY docker/requirements.txt docker/build-requirements.txt .wheelhous[e] /wheelhouse/
RUN set -eu; \
    want="$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"; \
    if [ -f /wheelhouse/PYTHON_TAG ] && [ "$(cat /wheelhouse/PYTHON_TAG)" != "$want" ]; then \
        echo "the wheelhouse is for $(cat /wheelhouse/PYTHON_TAG) but this base has Python $want:" \
             "remake it with build.sh --python" >&2; exit 1; \
    fi; \
    python3 -m venv /opt/venv; \
    /opt/venv/bin/pip install -q -r /wheelhouse/requirements.txt; \
    python3 -m venv /opt/buildenv; \
    /opt/buildenv/bin/pip install -q -r /wheelhouse/build-requirements.txt

# ---------------------------------------------------------------------------------------------
# Our sources in a stage of their own: the runtime copies /opt/venv from `deps`, whose image does
# not change with our sources, so that big COPY stays a cache hit without re-hashing the venv.
FROM deps AS builder

# C++ first: compile the core from the C++ inputs alone into the persistent build dir
# (pyproject's build-dir), so a later change to Python files finds the objects up to date.
# README.md is a placeholder here (metadata needs one); the real one comes with the sources.
# If the C++ build grows inputs outside these paths, add them here; until then the full build
# below still works, it just compiles from scratch.
WORKDIR /src
COPY pyproject.toml CMakeLists.txt ./
COPY appliance/runtime/csrc/ appliance/runtime/csrc/
RUN touch README.md; \
    /opt/buildenv/bin/pip wheel -q --no-deps --no-build-isolation -w /tmp/prebuild . \
    || echo "builder: the C++-only pre-build failed; the full build compiles from scratch" >&2; \
    rm -rf /tmp/prebuild

COPY README.md ./
COPY appliance/ appliance/
RUN set -eux; \
    /opt/buildenv/bin/pip wheel --no-deps --no-build-isolation -w /dist . ; \
    ls -l /dist

# ---------------------------------------------------------------------------------------------
FROM os AS runtime
# Dependencies first (a cache hit unless the wheelhouse or requirements changed).
COPY --from=deps /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none \
    APPLIANCE_SHARED=/mnt/share \
    APPLIANCE_SSH_PORT=12345

COPY docker/sshd_config /etc/ssh/sshd_config
COPY docker/ssh_config /etc/ssh/ssh_config.d/appliance.conf
COPY docker/entrypoint.sh /usr/local/bin/appliance-entrypoint
COPY docker/healthcheck.sh /usr/local/bin/appliance-healthcheck
# No host keys in the image (each container makes its own, or takes the cluster's from the share);
# pam_loginuid cannot work in a container; env for SSH sessions (Docker ENV is not visible there).
RUN set -eux; \
    chmod 0755 /usr/local/bin/appliance-entrypoint /usr/local/bin/appliance-healthcheck; \
    chmod 0644 /etc/ssh/sshd_config /etc/ssh/ssh_config.d/appliance.conf; \
    rm -f /etc/ssh/ssh_host_*; \
    mkdir -p /run/sshd /root/.ssh; chmod 0755 /run/sshd; chmod 0700 /root /root/.ssh; \
    sed -i 's/^session\s\+required\s\+pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd; \
    appliance-entrypoint write-env

# Our wheel last: only this layer changes with our sources.
COPY --from=builder /dist/ /tmp/dist/
RUN set -eux; \
    /opt/venv/bin/pip install -q --no-index --no-deps --no-cache-dir /tmp/dist/appliance-*.whl; \
    rm -rf /tmp/dist; \
    /opt/venv/bin/pip check; \
    /opt/venv/bin/python -c "import appliance.runtime._core"; \
    echo "appliance=$(/opt/venv/bin/python -c 'import importlib.metadata as m; print(m.version("appliance"))')" \
        >> /etc/appliance/versions

# Image-only Python shims (docker/pyshim, not in the wheel): `import horovod.torch as hvd` is
# appliance.torch, `python -m train` is the default job unless the working directory has a
# train.py, and `horovodrun` is `appliance launch`.
COPY docker/pyshim/ /tmp/pyshim/
RUN set -eux; \
    site="$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
    cp -r /tmp/pyshim/horovod /tmp/pyshim/train.py "$site/"; \
    install -m 0755 /tmp/pyshim/horovodrun /opt/venv/bin/horovodrun; \
    rm -rf /tmp/pyshim; \
    cd /; /opt/venv/bin/python -c "import appliance.cluster.driver, train, horovod.torch as hvd, appliance.torch as a; assert hvd is a and hvd.init is a.init"; \
    /opt/venv/bin/horovodrun --help >/dev/null

EXPOSE 12345
HEALTHCHECK --interval=5s --timeout=4s --start-period=15s --retries=3 \
    CMD ["/usr/local/bin/appliance-healthcheck"]
ENTRYPOINT ["/usr/local/bin/appliance-entrypoint"]
CMD ["secondary"]
