#!/usr/bin/env bash
# cluster-up.sh: a real Slurm cluster on this one machine, for reshardctl's Slurm tests.
#
# Installs Debian's munge, slurmctld, slurmd, slurm-client, slurmdbd and MariaDB when missing (root),
# writes a private config (virtual nodes n1..nN on 127.0.0.1, one slurmd each, fake GPU char devices,
# backfill every second so het jobs start at once, slurmdbd so that sacct works), starts what is not
# running, and waits until every node is idle. Idempotent: a second call with everything up returns at
# once; a changed config restarts the Slurm daemons (by their recorded PIDs, never by name).
# cluster-down.sh stops exactly what this script started.
#
# Environment: RESHARDCTL_SLURM_NODES (4), _CPUS (8), _GPUS (4), _MEM (4000 MB), _WAIT (90 s).
# Needs Debian/Ubuntu with apt, root, no systemd needed. Het jobs need >= 3 nodes (components never
# share a node); the tests use up to 4.
set -euo pipefail

NODES=${RESHARDCTL_SLURM_NODES:-4}
CPUS=${RESHARDCTL_SLURM_CPUS:-8}
GPUS=${RESHARDCTL_SLURM_GPUS:-4}
MEM=${RESHARDCTL_SLURM_MEM:-4000}
WAIT_S=${RESHARDCTL_SLURM_WAIT:-90}
PORT0=17001

STATE=/var/spool/reshardctl-slurm     # controller state, slurmd spools, fake GPUs
LOGS=/var/log/reshardctl-slurm
PIDS=/run/reshardctl-slurm            # pid files and "started by us" marks
ETC=/etc/slurm
HOST=$(hostname -s)

say() { printf '[cluster-up %(%H:%M:%S)T] %s\n' -1 "$*"; }
fail() { say "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (installs packages and starts daemons)"

# a live, non-zombie process (PID 1 here reaps orphans a second or two late)
live() { local s; s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1); [ -n "$s" ] && [ "$s" != Z ]; }
# pidfile_live FILE COMM: the recorded process runs and is COMM
pidfile_live() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(tr -dc '0-9' <"$1")
  [ -n "$pid" ] && live "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}
stop_recorded() {  # FILE COMM: TERM, wait up to 10 s, KILL
  local pid i
  pidfile_live "$1" "$2" || { rm -f "$1"; return 0; }
  pid=$(tr -dc '0-9' <"$1")
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 100); do live "$pid" || break; sleep 0.1; done
  live "$pid" && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$1"
}
t0=$(date +%s%N)
took() { echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms"; }

# 1. packages
missing=()
for pair in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client slurmdbd:slurmdbd mariadbd:mariadb-server; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # in containers policy-rc.d refuses to start services at install: harmless, we start them below
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  say "installed ($(took))"
fi
mkdir -p "$STATE/ctld" "$STATE/d" "$STATE/gpu" "$LOGS" "$PIDS" "$ETC"

# 2. munge
[ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
chown munge:munge /etc/munge /etc/munge/munge.key; chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
if ! { pidfile_live /run/munge/munged.pid munged && munge -n </dev/null | unmunge >/dev/null 2>&1; }; then
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged --force
  touch "$PIDS/started-munged"
  for i in $(seq 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null || fail "munge does not work (/var/log/munge/munged.log)"
fi

# 3. configuration. Fake GPUs must be character devices: slurmd drops file-less GPUs and warns about
# regular files; a node whose GPUs vanish is drained. Same major/minor as /dev/null.
for ((i = 0; i < GPUS; i++)); do
  [ -c "$STATE/gpu/nvidia$i" ] || { rm -f "$STATE/gpu/nvidia$i"; mknod "$STATE/gpu/nvidia$i" c 1 3; }
done
names="n[1-$NODES]"; ports="[$PORT0-$((PORT0 + NODES - 1))]"
[ "$NODES" = 1 ] && { names=n1; ports=$PORT0; }
gres_node=""; gres_conf=""
if [ "$GPUS" -gt 0 ]; then
  gres_node="Gres=gpu:$GPUS"
  gres_conf="NodeName=$names Name=gpu File=$STATE/gpu/nvidia[0-$((GPUS - 1))]"
  [ "$GPUS" = 1 ] && gres_conf="NodeName=$names Name=gpu File=$STATE/gpu/nvidia0"
fi
slurm_conf="# written by reshardctl tests/slurm/cluster-up.sh
ClusterName=reshardctl
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
KillWait=5
MinJobAge=600
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d/%n
SlurmctldPidFile=$PIDS/slurmctld.pid
SlurmdPidFile=$PIDS/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
MailProg=/bin/true
GresTypes=gpu
NodeName=$names NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$ports CPUs=$CPUS RealMemory=$MEM $gres_node State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
dbd_conf="AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
LogFile=$LOGS/slurmdbd.log
PidFile=$PIDS/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=reshardctl_slurm_acct
StorageUser=slurm
StoragePass=reshardctl-ci"
changed=0
put() {  # FILE CONTENT MODE
  if [ ! -f "$1" ] || [ "$(cat "$1")" != "$2" ]; then printf '%s\n' "$2" >"$1"; changed=1; fi
  chmod "$3" "$1"
}
put "$ETC/slurm.conf" "$slurm_conf" 0644
put "$ETC/gres.conf" "$gres_conf" 0644
put "$ETC/slurmdbd.conf" "$dbd_conf" 0600
if [ "$changed" = 1 ]; then
  say "configuration written"
  for f in "$PIDS"/slurmd-*.pid; do [ -e "$f" ] && stop_recorded "$f" slurmd; done
  stop_recorded "$PIDS/slurmctld.pid" slurmctld
  stop_recorded "$PIDS/slurmdbd.pid" slurmdbd
fi

# 4. MariaDB (unix socket only) and slurmdbd, so that sacct answers
mkdir -p /run/mysqld; chown mysql:mysql /run/mysqld
if ! pidfile_live /run/mysqld/mysqld.pid mariadbd; then
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  say "starting mariadbd"
  setsid /usr/sbin/mariadbd --user=mysql --pid-file=/run/mysqld/mysqld.pid --socket=/run/mysqld/mysqld.sock \
    --skip-networking --innodb-buffer-pool-size=128M >"$LOGS/mariadb.log" 2>&1 </dev/null &
  touch "$PIDS/started-mariadbd"
  for i in $(seq 150); do mariadb-admin --socket=/run/mysqld/mysqld.sock ping >/dev/null 2>&1 && break; sleep 0.2; done
  mariadb-admin --socket=/run/mysqld/mysqld.sock ping >/dev/null || fail "mariadbd did not start ($LOGS/mariadb.log)"
fi
mariadb --socket=/run/mysqld/mysqld.sock -e "CREATE DATABASE IF NOT EXISTS reshardctl_slurm_acct;
  CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'reshardctl-ci';
  GRANT ALL ON reshardctl_slurm_acct.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
if ! pidfile_live "$PIDS/slurmdbd.pid" slurmdbd; then
  say "starting slurmdbd"
  slurmdbd
  for i in $(seq 100); do sacctmgr -n -P list cluster >/dev/null 2>&1 && break; sleep 0.2; done
  sacctmgr -n -P list cluster >/dev/null 2>&1 || fail "slurmdbd does not answer ($LOGS/slurmdbd.log)"
fi

# 5. controller and one slurmd per virtual node
pidfile_live "$PIDS/slurmctld.pid" slurmctld || { say "starting slurmctld"; slurmctld; }
for i in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.2; done
scontrol ping | grep -q 'is UP' || fail "slurmctld does not answer ($LOGS/slurmctld.log)"
for ((n = 1; n <= NODES; n++)); do
  if ! pidfile_live "$PIDS/slurmd-n$n.pid" slurmd; then
    mkdir -p "$STATE/d/n$n"
    slurmd -N "n$n"
  fi
done

# 6. every node idle (resume nodes left down or drained by an earlier run)
end=$(( $(date +%s) + WAIT_S ))
while :; do
  ok=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | awk '$2 ~ /^(idle|mixed|allocated)$/' | grep -c . || true)
  [ "$ok" -ge "$NODES" ] && break
  bad=$(sinfo -h -N -t down,drain,fail -o '%N' 2>/dev/null | sort -u | paste -sd, || true)
  [ -n "$bad" ] && scontrol update NodeName="$bad" State=RESUME 2>/dev/null || true
  [ "$(date +%s)" -ge "$end" ] && { sinfo -N -l; fail "nodes not idle after ${WAIT_S} s"; }
  sleep 0.3
done
say "cluster up: $NODES nodes x $CPUS CPUs, $GPUS fake GPUs each, partition debug ($(took))"
