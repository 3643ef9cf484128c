#!/usr/bin/env bash
# System packages the test suite needs (run by the nox "tests" session; CI runs it as root).
# Idempotent and quiet on success: installs only what is missing, starts nothing persistent.
# One function per package group; add a group and call it at the bottom.
set -euo pipefail

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_system.sh: not root or no apt-get; skipping system packages" \
         "(MPI, Swift and Azurite tests will be skipped with a reason)" >&2
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0

# install PACKAGE... when any is missing (apt-get update once per run, only if needed)
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$APT_UPDATED" -eq 0 ]; then
        apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null
        APT_UPDATED=1
    fi
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Open MPI: real `mpirun -np 2` tests (tests/test_mpi.py); mpi4py comes from the [mpi] extra
setup_openmpi() {
    apt_install openmpi-bin libopenmpi-dev
}

# OpenStack Swift with s3api + memcached: the real object store of the S3 tests
# (started and stopped per test session by tests/plugins/s3servers.py, never here)
setup_swift() {
    apt_install swift swift-proxy swift-object swift-container swift-account memcached
}

# fio: the baseline of benchmarks/bench_fio.py (tests/test_bench_fio.py runs a small one)
setup_fio() {
    apt_install fio
}

# Node.js and npm: they run Azurite, the Azure Blob emulator (npm-installed into a cache dir by
# `python -m asyncckpt.servers.azurite install` in the nox tests session, never globally)
setup_node() {
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && return 0
    apt_install nodejs npm
}

setup_openmpi
setup_swift
setup_fio
setup_node
