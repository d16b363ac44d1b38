#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for the tests and for trying the Slurm provider:
# one slurmctld and one `slurmd -N nX` per fake node, all on 127.0.0.1 (Debian's slurm-wlm is
# built with --enable-multiple-slurmd). Partitions: "main" (PriorityTier 10, never preempted,
# default) and "backfill" (PriorityTier 1, preemptible with a grace time). Backfill scheduler.
#
#   scripts/slurm-loopback.sh up      # install missing packages (root), configure, start, wait
#   source .slurm-loopback/env.sh     # SLURM_CONF for sbatch/squeue/scontrol
#   scripts/slurm-loopback.sh down    # stop the daemons and any job processes left
#   scripts/slurm-loopback.sh lockfile  # the lock of these ports: hold it (flock) from up to down
#
# Settings (environment): SLURM_LOOPBACK_DIR (default .slurm-loopback in the checkout),
# NNODES (4), GRACE_TIME (10 s between the preemption signal and the kill), PREEMPT_MODE
# (REQUEUE or CANCEL), CTLD_PORT (6817), BASE_PORT (17000). Authentication is auth/none: the
# daemons listen on loopback only. Needs root (the daemons run as root).
# Two clusters on the same ports cannot both run: a second `up` would find the ports taken, or
# its `down` would leave the first without a controller. Whoever brings a cluster up on shared
# ports (two test sessions on one machine) holds the lock file of its CTLD_PORT meanwhile.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${SLURM_LOOPBACK_DIR:-$here/.slurm-loopback}
nodes=${NNODES:-4}
grace=${GRACE_TIME:-10}
mode=${PREEMPT_MODE:-REQUEUE}
ctld_port=${CTLD_PORT:-6817}
base_port=${BASE_PORT:-17000}
conf=$dir/etc/slurm.conf

down() {
  # Jobs first, through the controller, so that their processes are killed properly.
  if [ -f "$conf" ] && SLURM_CONF=$conf scontrol ping 2>/dev/null | grep -q 'is UP'; then
    SLURM_CONF=$conf scancel --quiet --full --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(SLURM_CONF=$conf squeue -h -t R,CG 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  for pidfile in "$dir"/run/*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
  done
  sleep 0.5
  for pidfile in "$dir"/run/*.pid; do
    [ -e "$pidfile" ] || continue
    kill -9 "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  # Job steps of this cluster still around (their working directory is in $dir) and their jobs.
  for pid in $(pgrep -x slurmstepd || true); do
    case "$(readlink "/proc/$pid/cwd" 2>/dev/null)" in
      "$dir"*) pkill -9 -P "$pid" 2>/dev/null || true; kill -9 "$pid" 2>/dev/null || true ;;
    esac
  done
  echo "slurm-loopback: stopped ($dir)"
}

up() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-loopback: needs root (the Slurm daemons run as root)" >&2; exit 1
  fi
  missing=()
  for b in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client; do
    command -v "${b%%:*}" >/dev/null 2>&1 || missing+=("${b#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "slurm-loopback: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" \
      >/dev/null 2>&1 || { apt-get -qq update && apt-get install -y -qq \
      --no-install-recommends "${missing[@]}" >/dev/null; }
  fi
  [ -d "$dir/run" ] && down >/dev/null
  rm -rf "$dir"
  mkdir -p "$dir"/{etc,run,state,log}
  for i in $(seq 1 "$nodes"); do mkdir -p "$dir/spool/n$i"; done
  host=$(hostname -s)
  cat > "$conf" <<CONF
ClusterName=loopback
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=300
KillWait=5
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,bf_resolution=10,bf_window=120,bf_continue,sched_interval=5
# The job's --signal=B:SIG@T arrives at the start of the preemption grace time.
SlurmctldParameters=preempt_send_user_signal
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=n[1-$nodes] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((base_port + 1))-$((base_port + nodes))] CPUs=1 RealMemory=1000 State=UNKNOWN
PartitionName=main     Nodes=n[1-$nodes] Default=YES PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
PartitionName=backfill Nodes=n[1-$nodes] Default=NO  PriorityTier=1  PreemptMode=$mode GraceTime=$grace MaxTime=INFINITE State=UP
CONF
  echo "export SLURM_CONF=$conf" > "$dir/env.sh"
  export SLURM_CONF=$conf
  slurmctld -f "$conf"
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
  if ! scontrol ping 2>/dev/null | grep -q 'is UP'; then
    echo "slurm-loopback: slurmctld did not start; see $dir/log/slurmctld.log" >&2; exit 1
  fi
  for i in $(seq 1 "$nodes"); do slurmd -f "$conf" -N "n$i"; done
  idle=0
  for _ in $(seq 300); do
    idle=$(sinfo -h -p main -t idle -o '%D' 2>/dev/null | awk '{s += $1} END {print s + 0}')
    [ "$idle" -ge "$nodes" ] && break
    sleep 0.2
  done
  if [ "$idle" -lt "$nodes" ]; then
    echo "slurm-loopback: only $idle of $nodes nodes idle after 60 s" >&2; sinfo -R >&2; exit 1
  fi
  echo "slurm-loopback: $nodes nodes idle; source $dir/env.sh"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  lockfile) echo "${TMPDIR:-/tmp}/parsl_bf-slurm-loopback-$ctld_port.lock" ;;
  *) echo "usage: $0 up|down|lockfile" >&2; exit 2 ;;
esac
