#!/bin/sh
# Build the ReasonRay image (../Dockerfile) without a Docker engine or an image registry: buildah builds it
# on a Debian bookworm base that debootstrap makes from the Debian mirror (docs/deploy.md).
#   deploy/build-image.sh [TAG]        TAG defaults to localhost/reasonray:latest
# Needs root (debootstrap and buildah's chroot isolation), buildah and debootstrap (apt-get install buildah
# debootstrap). Environment:
#   BASE_IMAGE       the image to build on; default localhost/reasonray-base:bookworm, made when missing
#   DEBIAN_MIRROR    the mirror debootstrap uses; default http://deb.debian.org/debian
#   PIP_FIND_LINKS   a local directory of wheels: lent to the build read-only (pip searches it as well)
#   TORCH_INDEX_URL  where torch==2.13.0 comes from; default the Dockerfile's (PyTorch's CPU index), or
#                    PyPI when PIP_FIND_LINKS holds the CPU wheel (PyPI's own Linux torch is the CUDA build)
#   STORAGE_DRIVER   buildah's storage driver; default vfs, which works in any container or VM
set -eu
cd "$(dirname "$0")/.."

tag=${1:-localhost/reasonray:latest}
base=${BASE_IMAGE:-localhost/reasonray-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}"

for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "build-image: $tool is missing: apt-get install buildah debootstrap (as root)" >&2
        exit 1
    }
done

make_base() {
    work=$(mktemp -d /var/tmp/reasonray-base.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    echo "build-image: making $base with debootstrap from $mirror" >&2
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
        tail -20 "$work/debootstrap.log" >&2
        echo "build-image: debootstrap failed (log above)" >&2
        exit 1
    }
    # The base trusts what this host trusts: where egress passes a TLS-inspecting proxy, its CA lies in
    # /usr/local/share/ca-certificates, and without it pip inside the build cannot reach PyPI.
    if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
        cp /usr/local/share/ca-certificates/*.crt "$work/rootfs/usr/local/share/ca-certificates/"
        chroot "$work/rootfs" update-ca-certificates >/dev/null 2>&1
    fi
    rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
    tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
    container=$(buildah from scratch)
    buildah add --quiet "$container" "$work/rootfs.tar" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd /bin/bash "$container"
    buildah commit --quiet --rm "$container" "$base" >/dev/null
    rm -rf "$work"
    trap - EXIT
}

buildah inspect --type image "$base" >/dev/null 2>&1 || make_base

# docker format: the OCI image config has no HEALTHCHECK, and buildah would drop it
set -- --isolation chroot --format docker --build-arg "BASE_IMAGE=$base" --tag "$tag" --file Dockerfile
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ]; then
    set -- "$@" --volume "$PIP_FIND_LINKS:/wheels:ro" --build-arg WHEELS_DIR=/wheels
    if [ -z "${TORCH_INDEX_URL:-}" ] && ls "$PIP_FIND_LINKS"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
        TORCH_INDEX_URL=https://pypi.org/simple  # torch's dependencies; torch itself is the lent CPU wheel
    fi
fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    set -- "$@" --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"
fi
echo "build-image: buildah bud $* ." >&2
buildah bud "$@" .
