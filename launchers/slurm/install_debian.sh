#!/usr/bin/env bash
# Install the Debian packages that launchers/slurm/local_cluster.sh needs (Slurm 22.05 on Debian 12):
# controller, compute daemon, client commands, munge authentication, and the accounting
# daemon with MariaDB (submitit reads job states through sacct, which needs slurmdbd).
# Installing starts no daemon on a machine without systemd; local_cluster.sh starts them.
# Must run as root (or through sudo). Idempotent: already-installed packages are left alone.
set -euo pipefail

# iproute2 and util-linux (ip, nsenter, unshare): the two-host cluster's namespaces
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server iproute2 util-linux)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v slurmdbd >/dev/null \
    && command -v sacct >/dev/null && command -v munged >/dev/null && command -v mariadbd >/dev/null \
    && command -v ip >/dev/null && command -v nsenter >/dev/null; then
    echo "install_debian.sh: Slurm, munge and MariaDB are already installed"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${PACKAGES[@]}"
