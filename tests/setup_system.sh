#!/usr/bin/env bash
# System packages the test suite needs (run by the nox "tests" session; idempotent, quiet).
# Installs only what is missing; starts nothing persistent. One function per package group.
set -euo pipefail

if [[ "$(id -u)" != "0" ]]; then
    echo "setup_system.sh: not root; skipping system packages (install them yourself)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0

apt_install() {  # apt_install PKG... : install the missing ones, apt-get update at most once
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $APT_UPDATED == 0 ]]; then
        apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null
        APT_UPDATED=1
    fi
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_openmpi() {  # real `mpirun -np 2` tests (tests/test_mpi.py); mpi4py comes from the [mpi] extra
    apt_install openmpi-bin libopenmpi-dev
}

install_openmpi
