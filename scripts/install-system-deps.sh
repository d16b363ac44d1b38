#!/usr/bin/env bash
# Debian packages the project needs; installs only what is missing (idempotent).
# GLPK's glpsol solves the allocation MILP. MPI comes from PyPI (see README), not from here.
set -euo pipefail
missing=()
command -v glpsol >/dev/null 2>&1 || missing+=(glpk-utils)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
  echo "error: need root (or sudo) to install ${missing[*]}; install them and rerun" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
