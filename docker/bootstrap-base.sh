#!/usr/bin/env bash
# bootstrap-base.sh: make a minimal Debian base image for machines without a registry.
#
#   bash docker/bootstrap-base.sh [IMAGE] [--cache DIR] [--refresh]
#
# What it owns: one image (default appliance-base:bookworm) made with
# `debootstrap --variant=minbase` and `docker import`, and a cached rootfs tarball
# (DIR/rootfs-<suite>-minbase-<arch>.tar) so a second import, e.g. after `docker rmi` within
# one CI run, takes seconds instead of ~1 min. It does nothing when the image already exists.
# The image has no apt lists; installs in a Dockerfile start with `apt-get update`.
#
# The Debian mirror is the one this host's apt uses for the suite (deb822 or one-line sources),
# else debootstrap's own default; on a host of the same suite the host's apt sources (updates,
# security) are copied in, so images get the same fixes as the host.
#
# Env: APPLIANCE_CACHE_DIR (default ~/.cache/appliance), DEBIAN_SUITE (default bookworm),
#      DEBIAN_MIRROR (overrides the mirror found in the host's apt sources).
# Failure modes: needs root (debootstrap creates device nodes) and a running Docker engine; any
# failure is one "bootstrap-base: ERROR: ..." line and a non-zero exit, and leaves no half image.
set -euo pipefail

IMAGE=appliance-base:bookworm
CACHE="${APPLIANCE_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/appliance}"
SUITE="${DEBIAN_SUITE:-bookworm}"
REFRESH=0

say() { echo "bootstrap-base: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

while (($#)); do
    case "$1" in
        --cache) CACHE="${2:?--cache needs a directory}"; shift 2 ;;
        --refresh) REFRESH=1; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) IMAGE="$1"; shift ;;
    esac
done

command -v docker >/dev/null || die "docker is not installed (run .ci/docker-up.sh)"
docker info >/dev/null 2>&1 || die "the Docker daemon is not answering (run .ci/docker-up.sh)"

if ((!REFRESH)) && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE exists; nothing to do"
    exit 0
fi

# Mirror URI of the host's apt for $SUITE: deb822 stanzas first, then one-line sources.
host_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        awk -v suite="$SUITE" '
            BEGIN { RS=""; FS="\n" }
            {
                uri=""; ok=0; deb=0
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^URIs:/)   { split($i, a, /[ \t]+/); uri = a[2] }
                    if ($i ~ /^Types:/ && $i ~ /(^|[ \t])deb([ \t]|$)/) deb = 1
                    if ($i ~ /^Suites:/) { n = split($i, s, /[ \t]+/); for (j = 2; j <= n; j++) if (s[j] == suite) ok = 1 }
                }
                if (ok && deb && uri != "") { print uri; exit }
            }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        awk -v suite="$SUITE" '$1 == "deb" && $0 !~ /\[/ && $3 == suite { print $2; exit }
                               $1 == "deb" && $0 ~ /\[/ { sub(/\[[^]]*\][ \t]*/, ""); if ($3 == suite) { print $2; exit } }' "$f"
    done
}

host_suite() { (. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}") || true; }

ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
TARBALL="$CACHE/rootfs-$SUITE-minbase-$ARCH.tar"
mkdir -p "$CACHE"
exec 9>"$CACHE/.bootstrap-$SUITE.lock"
flock -w 900 9 || die "could not lock $CACHE (another bootstrap stuck?)"

if ((REFRESH)) || [[ ! -s "$TARBALL" ]]; then
    [[ $EUID -eq 0 ]] || die "debootstrap needs root"
    command -v debootstrap >/dev/null || die "debootstrap is not installed (run .ci/docker-up.sh)"
    MIRROR="${DEBIAN_MIRROR:-$(host_mirror | head -n 1)}"
    ROOTFS="$(mktemp -d "$CACHE/rootfs-$SUITE.XXXXXX")"
    trap 'rm -rf "$ROOTFS" "$TARBALL.part"' EXIT
    say "debootstrap --variant=minbase $SUITE ${MIRROR:-(debootstrap default mirror)} (~1 min)"
    t0=$SECONDS
    debootstrap --variant=minbase --arch="$ARCH" "$SUITE" "$ROOTFS" ${MIRROR:+"$MIRROR"} \
        >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -n 15 "$CACHE/debootstrap.log" >&2; die "debootstrap failed (log: $CACHE/debootstrap.log)"; }
    [[ -x "$ROOTFS/bin/sh" ]] || die "debootstrap produced no /bin/sh"

    # Same apt sources as the host when the suites match (adds updates and security).
    if [[ "$(host_suite)" == "$SUITE" && -z "${DEBIAN_MIRROR:-}" ]]; then
        if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
            rm -f "$ROOTFS/etc/apt/sources.list"
            cp /etc/apt/sources.list.d/*.sources "$ROOTFS/etc/apt/sources.list.d/"
        elif [[ -f /etc/apt/sources.list ]]; then
            cp /etc/apt/sources.list "$ROOTFS/etc/apt/sources.list"
        fi
    fi
    # Container conventions: no recommends, no docs/man pages, no apt caches left in layers.
    cat >"$ROOTFS/etc/apt/apt.conf.d/90appliance" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
EOF
    cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/90appliance-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    find "$ROOTFS/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    rm -rf "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
        "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
        "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/log/*.log "$ROOTFS"/tmp/*
    : >"$ROOTFS/etc/hostname"
    tar --numeric-owner --xattrs -C "$ROOTFS" -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
    rm -rf "$ROOTFS"
    trap - EXIT
    say "rootfs cached at $TARBALL ($(du -h "$TARBALL" | cut -f1), $((SECONDS - t0)) s)"
else
    say "using cached $TARBALL"
fi

say "docker import -> $IMAGE"
docker import \
    -c 'ENV LANG=C.UTF-8' \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["/bin/bash"]' \
    -c "LABEL org.opencontainers.image.title=$IMAGE appliance.base.suite=$SUITE appliance.base.variant=minbase" \
    -m "debootstrap --variant=minbase $SUITE" \
    "$TARBALL" "$IMAGE" >/dev/null \
    || die "docker import of $TARBALL failed"
say "made $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
