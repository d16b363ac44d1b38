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
#   scripts/slurm-loopback.sh on n2 CMD…  # HOSTS=netns: run CMD on host n2, as `ssh n2 CMD` would
#
# Settings (environment): SLURM_LOOPBACK_DIR (default .slurm-loopback in the checkout),
# NNODES (4), GRACE_TIME (10 s between the preemption signal and the kill), PREEMPT_MODE
# (REQUEUE or CANCEL), CTLD_PORT (6817), BASE_PORT (17000). Authentication is auth/none: the
# daemons listen on loopback only. Needs root (the daemons run as root).
#
# HOSTS=netns: separate hosts instead. Each node nI is a host of its own: a network namespace
# (its own address NETNS_NET.(10+I) on a bridge this script creates, its own `lo`), a UTS
# namespace (hostname nI) and a private mount namespace (an /etc/hosts naming the machine and
# every node), with one slurmd inside; slurmctld runs on the machine at NETNS_NET.1. Ranks on
# two nodes then talk over TCP, as on a real cluster. NETNS_NET (default 10.213.<CTLD_PORT
# mod 250>: a /24 no route of the machine covers yet) keeps the addresses inside these
# namespaces and the bridge; a driver that pilots reach must listen on NETNS_NET.1 (written to
# env.sh as PARSL_BF_ADDRESS). Namespaces and the bridge are named after CTLD_PORT, and
# `down` removes every one of them (also after a crash).
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
hosts_mode=${HOSTS:-loopback}
# netns names: <= 15 characters (interface names), unique per cluster (its controller port)
ns_prefix=pbf${ctld_port}n
bridge=pbfbr${ctld_port}
net=${NETNS_NET:-10.213.$((ctld_port % 250))}

# Every namespace, veth and bridge of this cluster's ports, whatever `up` got to before a crash.
netns_down() {
  command -v ip >/dev/null 2>&1 || return 0
  for ns in $(ip netns list 2>/dev/null | awk -v p="$ns_prefix" 'index($1, p) == 1 {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 \
      | grep -E "^(${ns_prefix}v[0-9]+|$bridge)\$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
}

netns_up() {
  command -v ip >/dev/null 2>&1 || { echo "slurm-loopback: HOSTS=netns needs iproute2 (ip)" >&2; exit 1; }
  if ip -4 route show | grep -q "^$net\.0/24" && ! ip link show "$bridge" >/dev/null 2>&1; then
    echo "slurm-loopback: $net.0/24 is routed on this machine already; set NETNS_NET" >&2; exit 1
  fi
  ip link add "$bridge" type bridge
  ip addr add "$net.1/24" dev "$bridge"
  ip link set "$bridge" up
  printf '127.0.0.1 localhost\n%s %s\n' "$net.1" "$(hostname -s)" > "$dir/etc/hosts"
  for i in $(seq 1 "$nodes"); do
    ns=$ns_prefix$i
    ip netns add "$ns"
    ip link add "${ns_prefix}v$i" type veth peer name eth0 netns "$ns"
    ip link set "${ns_prefix}v$i" master "$bridge" up
    ip -n "$ns" addr add "$net.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via "$net.1"
    echo "$net.$((10 + i)) n$i" >> "$dir/etc/hosts"
    # A host's own identity: libraries that tell hosts apart by boot or machine id (UCX picks
    # shared memory between processes it finds on one machine) see separate hosts.
    cat /proc/sys/kernel/random/uuid > "$dir/etc/boot_id.n$i"
    cat /proc/sys/kernel/random/uuid | tr -d - > "$dir/etc/machine-id.n$i"
  done
}

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
  netns_down
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
  netns_down  # a crashed cluster of the same ports
  rm -rf "$dir"
  mkdir -p "$dir"/{etc,run,state,log}
  for i in $(seq 1 "$nodes"); do mkdir -p "$dir/spool/n$i"; done
  host=$(hostname -s)
  ctld_addr=127.0.0.1
  node_line="NodeName=n[1-$nodes] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((base_port + 1))-$((base_port + nodes))]"
  case "$hosts_mode" in
    loopback) ;;
    netns)
      netns_up
      ctld_addr=$net.1
      # every slurmd on the same port: the addresses differ
      node_line="NodeName=n[1-$nodes] NodeAddr=$net.[11-$((10 + nodes))] Port=$((base_port + 1))" ;;
    *) echo "slurm-loopback: HOSTS is loopback or netns, not $hosts_mode" >&2; exit 2 ;;
  esac
  cat > "$conf" <<CONF
ClusterName=loopback
SlurmctldHost=$host($ctld_addr)
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
$node_line CPUs=1 RealMemory=1000 State=UNKNOWN
PartitionName=main     Nodes=n[1-$nodes] Default=YES PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
PartitionName=backfill Nodes=n[1-$nodes] Default=NO  PriorityTier=1  PreemptMode=$mode GraceTime=$grace MaxTime=INFINITE State=UP
CONF
  echo "export SLURM_CONF=$conf" > "$dir/env.sh"
  [ "$hosts_mode" = netns ] && echo "export PARSL_BF_ADDRESS=$ctld_addr" >> "$dir/env.sh"
  export SLURM_CONF=$conf
  slurmctld -f "$conf"
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
  if ! scontrol ping 2>/dev/null | grep -q 'is UP'; then
    echo "slurm-loopback: slurmctld did not start; see $dir/log/slurmctld.log" >&2; exit 1
  fi
  for i in $(seq 1 "$nodes"); do
    if [ "$hosts_mode" = netns ]; then
      # nsenter, not `ip netns exec`: that remounts /sys, and slurmd then finds no cgroup fs.
      nsenter --net="/run/netns/$ns_prefix$i" unshare --uts --mount --propagation private \
        sh -c "mount --bind '$dir/etc/hosts' /etc/hosts && mount --bind '$dir/etc/boot_id.n$i' /proc/sys/kernel/random/boot_id && { [ ! -e /etc/machine-id ] || mount --bind '$dir/etc/machine-id.n$i' /etc/machine-id; } && hostname n$i && exec slurmd -f '$conf' -N n$i"
    else
      slurmd -f "$conf" -N "n$i"
    fi
  done
  idle=0
  for _ in $(seq 300); do
    idle=$(sinfo -h -p main -t idle -o '%D' 2>/dev/null | awk '{s += $1} END {print s + 0}')
    [ "$idle" -ge "$nodes" ] && break
    sleep 0.2
  done
  if [ "$idle" -lt "$nodes" ]; then
    echo "slurm-loopback: only $idle of $nodes nodes idle after 60 s" >&2; sinfo -R >&2; exit 1
  fi
  if [ "$hosts_mode" = netns ]; then
    echo "slurm-loopback: $nodes hosts idle (n1..n$nodes at $net.11..; driver at $net.1); source $dir/env.sh"
  else
    echo "slurm-loopback: $nodes nodes idle; source $dir/env.sh"
  fi
}

# A command on host $1 of a running HOSTS=netns cluster: inside the namespaces of that host's
# slurmd (network, hostname, the mounts of its /etc/hosts and ids), in this directory, with
# this environment; it replaces this shell, so signals and the exit status are the command's.
on() {
  local name=${1:-} pid
  shift || true
  if [ -z "$name" ] || [ $# -eq 0 ]; then echo "usage: $0 on HOST CMD..." >&2; exit 2; fi
  if [ ! -f "$dir/run/slurmd-$name.pid" ]; then
    echo "slurm-loopback: no host $name running under $dir" >&2; exit 2
  fi
  pid=$(cat "$dir/run/slurmd-$name.pid")
  if [ "$(readlink /proc/$pid/ns/net)" = "$(readlink /proc/self/ns/net)" ]; then
    echo "slurm-loopback: $name is not a separate host (HOSTS=netns)" >&2; exit 2
  fi
  exec nsenter --target "$pid" --net --uts --mount --wd="$PWD" -- "$@"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  lockfile) echo "${TMPDIR:-/tmp}/parsl_bf-slurm-loopback-$ctld_port.lock" ;;
  on) shift; on "$@" ;;
  *) echo "usage: $0 up|down|lockfile|on HOST CMD..." >&2; exit 2 ;;
esac
