#!/usr/bin/env bash
# Start a local Slurm cluster on this machine (root, Debian's slurm-wlm and munge), so that tests
# can submit the workflow through `--profile slurm` for real. Three nodes on this one host:
#   <hostname>      partition `debug` (the default): every job of the tests but the 2-node one
#   node1, node2    partition `multinode`: two more slurmd daemons on this host (`slurmd -N`,
#                   each with its own port, spool directory, pid and log file), so that a job on
#                   two nodes runs one srun task on each, as on a real cluster (tests/workflow/test_slurm_nodes.py)
# Idempotent: a cluster running this configuration is left as it is; one running another (e.g.
# the one-node cluster of an older checkout) is shut down (scontrol shutdown) and started again
# with this one; slurmctld keeps its jobs across the restart. Used by .ci/run (before the tests)
# and by tests/conftest.py.
set -euo pipefail

host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024 ))
conf=/etc/slurm/slurm.conf
nodes=("$host" node1 node2)

wanted=$(cat <<CONF
ClusterName=streamback-ci
SlurmctldHost=${host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
NodeName=${host} CPUs=${cpus} RealMemory=${mem_mb} State=UNKNOWN
NodeName=node1 NodeHostname=${host} NodeAddr=${host} Port=6821 CPUs=${cpus} RealMemory=$(( mem_mb / 2 )) State=UNKNOWN
NodeName=node2 NodeHostname=${host} NodeAddr=${host} Port=6822 CPUs=${cpus} RealMemory=$(( mem_mb / 2 )) State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
PartitionName=multinode Nodes=node1,node2 MaxTime=INFINITE State=UP
CONF
)

all_up() {
    local up
    up=$(sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 ~ /^(idle|mixed|allocated)/ {print $1}' | sort -u | wc -l)
    [ "$up" -eq "${#nodes[@]}" ]
}

running() {  # the daemon whose pid file is $1 is alive
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

if [ -f "$conf" ] && [ "$(cat "$conf")" = "$wanted" ] && all_up; then
    exit 0
fi

mkdir -p /etc/munge /var/log/munge /run/munge /var/lib/munge /var/spool/slurmctld /var/log/slurm /etc/slurm
for node in "${nodes[@]}"; do
    mkdir -p "/var/spool/slurmd/$node"
done
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /var/log/munge /run/munge /var/lib/munge
chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged

if ! { [ -f "$conf" ] && [ "$(cat "$conf")" = "$wanted" ]; }; then
    if pgrep -x slurmctld >/dev/null; then  # running another configuration: stop it and its slurmd daemons
        scontrol shutdown
        for _ in $(seq 30); do
            pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break
            sleep 1
        done
    fi
    printf '%s\n' "$wanted" > "$conf"
fi

running /run/slurmctld.pid || /usr/sbin/slurmctld
for node in "${nodes[@]}"; do
    running "/run/slurmd-$node.pid" || /usr/sbin/slurmd -N "$node"
done
for _ in $(seq 60); do
    if all_up; then
        exit 0
    fi
    sleep 1
done
echo "Slurm did not come up; see /var/log/slurm/" >&2
sinfo -N >&2 || true
tail -n 20 /var/log/slurm/*.log >&2 || true
exit 1
