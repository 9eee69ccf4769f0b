#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine (munge, slurmctld, slurmd), for the srun
# launcher test: `source scripts/slurm/start.sh DIR` exports SLURM_CONF; `scripts/slurm/stop.sh
# DIR` stops it. Needs root and Debian's slurmd, slurmctld, slurm-client and munge packages.
# Idempotent: a cluster already running from DIR is reused.
set -euo pipefail
dir="${1:?usage: start.sh DIR}"
mkdir -p "$dir"/{state,spool,log,run}
host="$(hostname -s)"
cpus=4   # more than this 2-core machine has: the test runs 4 tasks on one node
cat > "$dir/slurm.conf" <<CONF
ClusterName=boltccl-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=10 State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF="$dir/slurm.conf"
if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge:munge /run/munge
    runuser -u munge -- /usr/sbin/munged
fi
[ -f "$dir/run/slurmctld.pid" ] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null || slurmctld -f "$SLURM_CONF"
[ -f "$dir/run/slurmd.pid" ] && kill -0 "$(cat "$dir/run/slurmd.pid")" 2>/dev/null || slurmd -f "$SLURM_CONF"
for _ in $(seq 1 60); do
    if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
        echo "slurm: one-node cluster up ($host, $cpus CPUs), SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    sleep 0.5
done
echo "slurm: the node did not come up; logs in $dir/log" >&2
tail -20 "$dir/log/"*.log >&2 || true
exit 1
