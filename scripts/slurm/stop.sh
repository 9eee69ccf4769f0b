#!/usr/bin/env bash
# Stop the one-node Slurm cluster started by scripts/slurm/start.sh DIR (munge is left running).
set -uo pipefail
dir="${1:?usage: stop.sh DIR}"
for d in slurmd slurmctld; do
    pid="$(cat "$dir/run/$d.pid" 2>/dev/null)" && kill "$pid" 2>/dev/null
done
exit 0
