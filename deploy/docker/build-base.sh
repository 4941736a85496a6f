#!/usr/bin/env bash
# Make a local Debian base image for machines where no image registry is reachable (`FROM python:...` and
# `docker pull` fail there). Everywhere else, skip this: the Dockerfiles default to public bases.
#
#   deploy/docker/build-base.sh [IMAGE]        (default IMAGE: local/debian:bookworm)
#
# SMG_BASE_CACHE=FILE.tar keeps the root file system tarball between runs (imported instead of rebuilt).
#
# debootstraps a minimal bookworm from the Debian mirror this host's apt already uses (read at run time, so no
# mirror host name lives in the repository) and imports it with `docker import`. Needs root, debootstrap and
# a Docker daemon (DOCKER_HOST is honoured). Does nothing if IMAGE exists already.
set -euo pipefail
image="${1:-local/debian:bookworm}"
suite="bookworm"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image exists"
  exit 0
fi

mirror_of_host() {
  # deb822 sources (URIs: ...) first, then one-line sources (deb URI suite ...); the first plain debian archive.
  local files=(/etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list)
  local f uri
  for f in "${files[@]}"; do
    [ -r "$f" ] || continue
    uri=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i} /^deb / {for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) {print $i; break}}' "$f" \
      | grep -v -- '-security' | head -n 1 || true)
    if [ -n "$uri" ]; then
      echo "$uri"
      return 0
    fi
  done
  return 1
}

cache="${SMG_BASE_CACHE:-}"
if [ -n "$cache" ] && [ -s "$cache" ]; then
  docker import - "$image" <"$cache" >/dev/null
  echo "imported $image from $cache"
  exit 0
fi

mirror="${DEBIAN_MIRROR:-$(mirror_of_host || true)}"
if [ -z "$mirror" ]; then
  echo "error: no Debian mirror found in /etc/apt/sources*; set DEBIAN_MIRROR" >&2
  exit 1
fi

rootfs=$(mktemp -d /tmp/smg-node-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap $suite (minbase) into $rootfs"
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
  tail -n 20 "$rootfs.log" >&2
  rm -f "$rootfs.log"
  exit 1
}
rm -f "$rootfs.log"
# apt inside builds uses the same mirror; the image keeps no package lists.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
if [ -n "$cache" ]; then
  mkdir -p "$(dirname "$cache")"
  tar -C "$rootfs" -cf "$cache.part" . && mv "$cache.part" "$cache"
  docker import - "$image" <"$cache" >/dev/null
else
  tar -C "$rootfs" -c . | docker import - "$image" >/dev/null
fi
echo "imported $image"
