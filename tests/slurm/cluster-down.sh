#!/usr/bin/env bash
# cluster-down.sh: stop what cluster-up.sh started, by recorded PIDs only (never pkill). Cancels this
# cluster's jobs first. MariaDB and munged are stopped only when cluster-up.sh started them.
#   --purge   also delete the state, logs, configuration and the accounting database
set -uo pipefail
STATE=/var/spool/reshardctl-slurm; LOGS=/var/log/reshardctl-slurm; PIDS=/run/reshardctl-slurm; ETC=/etc/slurm
purge=0; [ "${1:-}" = --purge ] && purge=1
say() { printf '[cluster-down %(%H:%M:%S)T] %s\n' -1 "$*"; }
live() { local s; s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1); [ -n "$s" ] && [ "$s" != Z ]; }
pidfile_live() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(tr -dc '0-9' <"$1")
  [ -n "$pid" ] && live "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}
stop_recorded() {
  local pid i
  pidfile_live "$1" "$2" || { rm -f "$1"; return 0; }
  pid=$(tr -dc '0-9' <"$1")
  say "stopping $2 ($pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 150); do live "$pid" || break; sleep 0.1; done
  live "$pid" && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$1"
}
if pidfile_live "$PIDS/slurmctld.pid" slurmctld; then
  jobs=$(squeue -h -o '%A' 2>/dev/null | sort -u)
  if [ -n "$jobs" ]; then
    mapfile -t ids <<<"$jobs"
    scancel "${ids[@]}" 2>/dev/null || true
    for i in $(seq 60); do [ -z "$(squeue -h -o '%A' 2>/dev/null)" ] && break; sleep 0.5; done
  fi
fi
for f in "$PIDS"/slurmd-*.pid; do [ -e "$f" ] && stop_recorded "$f" slurmd; done
stop_recorded "$PIDS/slurmctld.pid" slurmctld
stop_recorded "$PIDS/slurmdbd.pid" slurmdbd
if [ "$purge" = 1 ] && pidfile_live /run/mysqld/mysqld.pid mariadbd; then
  mariadb --socket=/run/mysqld/mysqld.sock -e 'DROP DATABASE IF EXISTS reshardctl_slurm_acct' 2>/dev/null || true
fi
[ -e "$PIDS/started-mariadbd" ] && { stop_recorded /run/mysqld/mysqld.pid mariadbd; rm -f "$PIDS/started-mariadbd"; }
[ -e "$PIDS/started-munged" ] && { stop_recorded /run/munge/munged.pid munged; rm -f "$PIDS/started-munged"; }
[ "$purge" = 1 ] && rm -rf "$STATE" "$LOGS" "$PIDS" "$ETC/slurm.conf" "$ETC/gres.conf" "$ETC/slurmdbd.conf"
say "done"
