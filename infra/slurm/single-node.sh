#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, from Debian's packages (slurmctld, slurmd, munge),
# to try `train.sbatch` before a site's cluster: writes /etc/slurm/slurm.conf for this host
# (its CPUs and memory as `slurmd -C` reads them), starts munged, slurmctld and slurmd, and
# waits for the node to be idle. Run as root. `single-node.sh stop` stops the daemons.
#
#   apt-get install slurm-wlm munge openmpi-bin libpmix2
#   bash infra/slurm/single-node.sh && sbatch infra/slurm/train.sbatch ...
set -euo pipefail

if [[ "${1:-start}" == stop ]]; then
    pkill -x slurmd || true
    pkill -x slurmctld || true
    pkill -x munged || true
    exit 0
fi

for cmd in slurmctld slurmd munged sinfo; do
    command -v "$cmd" >/dev/null || {
        echo "single-node.sh: $cmd is missing (apt-get install slurm-wlm munge)" >&2
        exit 1
    }
done

host=$(hostname -s)
node=$(slurmd -C | head -1)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=pathfinder-local
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups in a container: processes are tracked by their parent, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
$node State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

[[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile /etc/munge/munge.key
chown -R munge:munge /etc/munge /run/munge 2>/dev/null || true
pgrep -x munged >/dev/null || runuser -u munge -- munged || munged --force
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd

for _ in $(seq 60); do
    state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
    if [[ "$state" == idle* ]]; then
        echo "single-node.sh: $host is $state"
        exit 0
    fi
    sleep 1
done
echo "single-node.sh: $host did not become idle (state: ${state:-none}); see /var/log/slurm/" >&2
exit 1
