#!/usr/bin/env bash
# Build the tfcluster image on a machine that reaches no container registry: only Debian's package
# mirror (for the base) and a Python package index (for the wheels) are needed, and only while building.
#
#   docker/build-offline.sh            build tfcluster:<inputs-hash> (and tag it tfcluster:latest),
#                                      or reuse it when an image of the same inputs exists
#   docker/build-offline.sh --tag      print the image name an unchanged tree builds, build nothing
#   docker/build-offline.sh --force    rebuild the final image even if it exists
#
# Steps: (1) a Debian bookworm root file system with python3 made by mmdebstrap (else debootstrap)
# in a folder and `docker import`ed as the base; (2) the wheels of docker/requirements.txt fetched
# into docker/wheels/ with `pip download` on this host (cp311, manylinux up to bookworm's glibc);
# (3) `docker build -f docker/Dockerfile` from that base, pip installing with --no-index. A user with
# a registry runs step 3 alone from python:3.11-slim-bookworm; the Dockerfile is the same.
#
# The tag is a hash of every file that goes into the image (this script, the Dockerfile, the
# requirements, setup.cfg, pyproject.toml, README.md, the package's source and examples/), so a second run on an
# unchanged tree builds nothing. Settings: TFCLUSTER_IMAGE_REPO (tfcluster), DEBIAN_MIRROR
# (http://deb.debian.org/debian), PYTHON (python3, the interpreter whose pip downloads the wheels).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPO=${TFCLUSTER_IMAGE_REPO:-tfcluster}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv
# Wheels that fit bookworm's CPython 3.11 on x86_64: glibc 2.36 runs manylinux_2_17 .. manylinux_2_36.
PY_TAGS=(--only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 --abi abi3 --abi none)
for minor in $(seq 17 36); do PY_TAGS+=(--platform "manylinux_2_${minor}_x86_64"); done
PY_TAGS+=(--platform manylinux2014_x86_64 --platform linux_x86_64)

say() { printf 'build-offline: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

inputs() {      # every file whose content goes into the image, in a fixed order
    cd "$ROOT"
    printf '%s\n' docker/build-offline.sh docker/Dockerfile docker/requirements.txt .dockerignore \
        pyproject.toml setup.cfg README.md
    find cluster launch examples -name '*.py' -type f | LC_ALL=C sort
}

inputs_hash() {
    cd "$ROOT"
    inputs | while read -r f; do printf '%s\0' "$f"; cat "$f"; printf '\0'; done | sha256sum | cut -c1-12
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

make_base() {   # $1: the base image name
    local tmp=$WORK
    say "[1/3] base: Debian $SUITE with $BASE_PACKAGES from $MIRROR into $tmp/rootfs"
    local start=$SECONDS
    # Documentation, manual pages and translations are of no use in the image.
    local excludes=(path-exclude=/usr/share/doc/* path-exclude=/usr/share/man/* path-exclude=/usr/share/locale/*
                    path-exclude=/usr/share/info/*)
    if command -v mmdebstrap >/dev/null; then
        local opts=()
        for e in "${excludes[@]}"; do opts+=(--dpkgopt="$e"); done
        mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" "${opts[@]}" \
            "$SUITE" "$tmp/rootfs" "$MIRROR" >&2 || die "mmdebstrap failed (is $MIRROR reachable?)"
    elif command -v debootstrap >/dev/null; then
        debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$tmp/rootfs" "$MIRROR" >&2 \
            || die "debootstrap failed (is $MIRROR reachable?)"
        rm -rf "$tmp"/rootfs/var/cache/apt/archives/*.deb "$tmp"/rootfs/usr/share/{doc,man,locale,info}/*
    else
        die 'neither mmdebstrap nor debootstrap is installed: apt-get install -y mmdebstrap'
    fi
    say "[1/3] base: root file system made in $((SECONDS - start))s; importing it as $1"
    tar -C "$tmp/rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' - "$1" >/dev/null || die "docker import of the base failed"
}

main() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/tfcluster-build.XXXXXX")
    # --one-file-system: never reach through a mount a killed mmdebstrap may have left in the rootfs.
    trap 'rm -rf --one-file-system "$WORK"' EXIT
    trap 'say interrupted; exit 130' INT TERM
    local force=0
    case "${1:-}" in
        --tag) printf '%s:%s\n' "$REPO" "$(inputs_hash)"; return 0 ;;
        --force) force=1 ;;
        '') ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; return 0 ;;
        *) die "unknown option $1 (expected --tag, --force or nothing)" ;;
    esac
    command -v docker >/dev/null || die 'no docker client: apt-get install -y docker.io'
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
        || die 'the Docker engine is not reachable (start dockerd, or set DOCKER_HOST)'
    local image="$REPO:$(inputs_hash)"
    if [ "$force" = 0 ] && have_image "$image"; then
        say "$image is up to date (same inputs): nothing to build"
        docker tag "$image" "$REPO:latest"
        printf '%s\n' "$image"
        return 0
    fi
    local t0=$SECONDS
    local base_hash
    base_hash=$(printf '%s %s %s' "$SUITE" "$BASE_PACKAGES" "$(declare -f make_base)" | sha256sum | cut -c1-12)
    local base="$REPO-base:$SUITE-$base_hash"
    if have_image "$base"; then
        say "[1/3] base: $base exists"
    else
        make_base "$base"
    fi

    say "[2/3] wheels: pip download -r docker/requirements.txt into docker/wheels/"
    local start=$SECONDS
    mkdir -p "$ROOT/docker/wheels"
    # The wheelhouse first (a rebuild needs no index when it already holds everything), else the index.
    "$PYTHON" -m pip download --disable-pip-version-check --quiet --quiet --dest "$ROOT/docker/wheels" "${PY_TAGS[@]}" \
        --no-index --find-links "$ROOT/docker/wheels" -r "$ROOT/docker/requirements.txt" >/dev/null 2>&1 \
    || "$PYTHON" -m pip download --disable-pip-version-check --quiet --quiet --dest "$ROOT/docker/wheels" "${PY_TAGS[@]}" \
        -r "$ROOT/docker/requirements.txt" >&2 || die 'pip download failed (is the package index reachable?)'
    say "[2/3] wheels: $(ls "$ROOT"/docker/wheels/*.whl | wc -l) wheels, $(du -sh "$ROOT/docker/wheels" | cut -f1) in $((SECONDS - start))s"

    say "[3/3] image: docker build -f docker/Dockerfile from $base, pip --no-index"
    start=$SECONDS
    # The classic builder (no BuildKit needed); its steps are shown, the rest of its output only on failure.
    local status=0
    DOCKER_BUILDKIT=0 docker build -f "$ROOT/docker/Dockerfile" \
        --build-arg "BASE=$base" --build-arg "PIP_INSTALL_FROM=--no-index --find-links /tmp/wheels" \
        --label "org.tfcluster.inputs=$image" -t "$image" -t "$REPO:latest" "$ROOT" > "$WORK/build.log" 2>&1 &
    local pid=$!
    tail -n +1 -f --pid="$pid" "$WORK/build.log" | grep --line-buffered -E '^(Step |Sending build context)' \
        | sed -u 's/^/build-offline:       /' >&2 || true
    wait "$pid" || status=$?
    if [ "$status" != 0 ]; then
        tail -n 25 "$WORK/build.log" | sed 's/^/    /' >&2
        die "docker build failed (exit $status); its last lines are above"
    fi
    local size
    size=$(docker image inspect -f '{{.Size}}' "$image")
    say "[3/3] image: $image built in $((SECONDS - start))s, $((size / 1000000)) MB; $((SECONDS - t0))s in all"
    # Images of earlier inputs share all but their last layers; drop their tags so they do not pile up.
    local old
    old=$(docker images "$REPO" --format '{{.Repository}}:{{.Tag}}' | grep -v -x -e "$image" -e "$REPO:latest" || true)
    if [ -n "$old" ]; then
        say "removing the images of earlier inputs: $(echo $old)"
        docker rmi $old >/dev/null 2>&1 || true
    fi
    printf '%s\n' "$image"
}

main "$@"
