#!/usr/bin/env bash
# `make image`: build deploy/container/Containerfile into IMAGE (default ringserve:latest): its
#   serving target (no torch), or TARGET=full (torch, export, the CUDA path) into IMAGE.
#   BASE unset: a Debian bookworm base made here by debootstrap and `docker import`d once as
#   ringserve-base:bookworm-slim (no image registry needed); BASE=python:3.11-slim where one is reached.
# The torch CPU wheel from pip's configured find-links directory, if any, goes into the build
# context (build/wheels/), so the image never takes a CUDA build. Needs root here: it installs
# docker.io and debootstrap with apt-get when they are missing and starts dockerd when no daemon
# answers (a machine without systemd).
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${IMAGE:-ringserve:latest}
BASE=${BASE:-}
log() { printf 'make image: %s\n' "$*" >&2; }

need() {  # need COMMAND PACKAGE
    command -v "$1" >/dev/null && return
    log "installing $2 (apt-get)"
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null
}

need dockerd docker.io
if ! docker info >/dev/null 2>&1; then
    log "starting dockerd (log: /var/log/ringserve-dockerd.log)"
    # The daemon outlives this script: it must not inherit a descriptor of ours (a lock held by
    # whoever ran `make image`, say), so every one past stderr is closed in it first.
    (
        for fd in /proc/self/fd/*; do
            fd=${fd##*/}
            [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"
        done
        exec setsid dockerd >/var/log/ringserve-dockerd.log 2>&1 </dev/null
    ) &
    for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null
fi

if [ -z "$BASE" ]; then
    BASE=ringserve-base:bookworm-slim
    if ! docker image inspect "$BASE" >/dev/null 2>&1; then
        need debootstrap debootstrap
        root=$(mktemp -d /var/tmp/ringserve-base.XXXXXX)
        log "debootstrap --variant=minbase bookworm $root"
        debootstrap --variant=minbase bookworm "$root" >/dev/null
        # apt's package lists and caches (about 85 MB), and the docs, man pages and translations
        # (about 50 MB), which no server reads; dpkg leaves the latter out of later installs too,
        # as the official slim images do.
        rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
            "$root"/var/cache/apt/archives/*.deb "$root"/usr/share/man/* "$root"/usr/share/info/* \
            "$root"/usr/share/locale/*
        find "$root"/usr/share/doc -type f ! -name copyright -delete
        printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
            'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
            'path-exclude /usr/share/locale/*' >"$root"/etc/dpkg/dpkg.cfg.d/ringserve-slim
        tar -C "$root" -c . | docker import - "$BASE" >/dev/null
        rm -rf "$root"
    fi
fi

pip_setting() {  # the values of one `pip config list` setting, e.g. find-links
    ${PYTHON:-python3} -m pip config list 2>/dev/null | sed -n "s/.*[.]$1='\(.*\)'/\1/p" | sort -u
}
rm -rf build/wheels build/certs && mkdir -p build/wheels build/certs
for cert in $(pip_setting cert); do  # a proxy's CA that pip trusts here: for pip in the build
    [ -f "$cert" ] && cp "$cert" build/certs/pip-ca.crt && log "pip's CA bundle: $cert"
done
for dir in $(pip_setting find-links); do
    for wheel in "$dir"/torch-*+cpu-cp311-*.whl; do
        [ -e "$wheel" ] || continue
        ln -f "$wheel" build/wheels/ 2>/dev/null || cp "$wheel" build/wheels/
        log "torch wheel: $wheel"
    done
done

TARGET=${TARGET:-serve}
log "docker build --network host --build-arg BASE=$BASE --target $TARGET -t $IMAGE"
start=$(date +%s)
docker build --network host --build-arg "BASE=$BASE" --target "$TARGET" \
    -f deploy/container/Containerfile -t "$IMAGE" .
log "built $IMAGE in $(( $(date +%s) - start )) s, $(docker image inspect -f '{{.Size}}' "$IMAGE") bytes"
