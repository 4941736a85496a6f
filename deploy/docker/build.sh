#!/usr/bin/env bash
# Build the smg-node image from this working tree.
#
#   deploy/docker/build.sh [TAG [DOCKER BUILD OPTIONS...]]     (default TAG: smg-node:local)
#
# DOCKERFILE (env) builds another image with the same CA handling, e.g. the compose vllm profile's engine:
#   DOCKERFILE=deploy/compose/vllm/Dockerfile deploy/docker/build.sh smg-node-vllm:local --build-arg ...
# BASE_IMAGE (env) picks the base: python:3.11-slim by default; local/debian:bookworm where no registry is
# reachable (make it with deploy/docker/build-base.sh). CAs the host trusts beyond the system bundle
# (/usr/local/share/ca-certificates/*.crt, e.g. an intercepting proxy's) are copied into the build stage for
# the duration of the build only, so pip can reach its index; they are removed afterwards and git-ignored.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag="${1:-smg-node:local}"
shift || true
dockerfile="${DOCKERFILE:-deploy/docker/Dockerfile}"
base="${BASE_IMAGE:-python:3.11-slim}"
ca_dir=deploy/docker/ca
copied=()
cleanup() { if [ "${#copied[@]}" -gt 0 ]; then rm -f "${copied[@]}"; fi; }
trap cleanup EXIT
for crt in /usr/local/share/ca-certificates/*.crt; do
  [ -e "$crt" ] || continue
  cp "$crt" "$ca_dir/build-$(basename "$crt")"
  copied+=("$ca_dir/build-$(basename "$crt")")
done
docker build -f "$dockerfile" --build-arg "BASE_IMAGE=$base" -t "$tag" "$@" .
