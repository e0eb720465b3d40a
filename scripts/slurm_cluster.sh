#!/usr/bin/env bash
# A one-node SLURM cluster with accounting on this machine, for hydratune's SLURM tests and for trying
# hydratune's SLURM launcher on a laptop: slurmctld + slurmd + slurmdbd (MariaDB) + munge, from Debian's
# packages, without systemd.
#
#   sudo scripts/slurm_cluster.sh up       # install what is missing (apt), start what is not running
#   scripts/slurm_cluster.sh status        # daemons, sinfo, accounting; exit 0 only when jobs can run
#   sudo scripts/slurm_cluster.sh down     # stop the daemons this script started (jobs are lost)
#
# `up` is idempotent: on a running cluster it checks and returns in about a second. It needs root, a
# Debian-like system with apt (Debian 12: SLURM 22.05) and, the first time, the package mirror (~45 s to
# install, ~10 s to start). It writes /etc/slurm/{slurm,slurmdbd}.conf (and refuses to replace ones it did
# not write), keeps state in /var/lib/slurm and logs in /var/log/slurm. A failed `up` writes its reason to
# $STATUS_FILE, which hydratune's SLURM tests show when they skip.
#
# The cluster: one node (this host, at least 2 CPUs declared so 2-task jobs run on a 1-core machine),
# one partition `debug` (default, no time limit), JobRequeue=1 (pre-empted jobs may requeue),
# accounting in MariaDB through slurmdbd (without it submitters cannot learn how a job ended: sacct),
# a scheduler that starts jobs within a second or two.
set -euo pipefail

CLUSTER=hydratune
PARTITION=debug
MARK="# written by hydratune scripts/slurm_cluster.sh"
CONF_DIR=/etc/slurm
STATE=/var/lib/slurm
LOGS=/var/log/slurm
STATUS_FILE=${HYDRATUNE_SLURM_STATUS:-/tmp/hydratune-slurm-status}
START_LOCK=/run/hydratune-slurm-up.pid
DB_SOCKET=/run/mysqld/mysqld.sock
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
BINARIES=(slurmctld slurmd sinfo slurmdbd munged mariadbd)
RECONFIGURED=0

say() { printf 'slurm_cluster: %s\n' "$*" >&2; }
fail() {
	say "$*"
	printf '%s\n' "$*" >"$STATUS_FILE" 2>/dev/null || true
	exit 1
}
running() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() { # wait_for <seconds> <what> <command...>: poll until the command succeeds
	local limit=$1 what=$2 start=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		((SECONDS - start < limit)) || fail "$what did not come up within ${limit}s (logs: $LOGS)"
		sleep 0.2
	done
}

install_packages() {
	local missing=() b
	for b in "${BINARIES[@]}"; do
		command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || missing+=("$b")
	done
	((${#missing[@]})) || return 0
	command -v apt-get >/dev/null || fail "not installed (${missing[*]}) and no apt-get here: install SLURM, slurmdbd, munge and MariaDB yourself"
	say "installing ${PACKAGES[*]} (missing: ${missing[*]})"
	export DEBIAN_FRONTEND=noninteractive
	local apt=(apt-get -q -y -o DPkg::Lock::Timeout=300)
	if ! apt-cache show slurmctld >/dev/null 2>&1; then
		"${apt[@]}" update >/dev/null || fail "apt-get update failed: is the package mirror reachable?"
	fi
	"${apt[@]}" install --no-install-recommends "${PACKAGES[@]}" >/dev/null ||
		fail "apt-get install ${PACKAGES[*]} failed"
}

ours_or_absent() { [[ ! -e $1 ]] || grep -qF "$MARK" "$1"; }

write_configs() {
	local host cpus memory
	host=$(hostname -s)
	# slurmd -C prints this host's NodeName line (CPUs, sockets, cores, threads, RealMemory)
	read -r cpus memory < <(slurmd -C | awk '/^NodeName/ {
		for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		print v["CPUs"], v["RealMemory"] }')
	((cpus >= 2)) || cpus=2
	for f in "$CONF_DIR/slurm.conf" "$CONF_DIR/slurmdbd.conf"; do
		ours_or_absent "$f" || fail "$f exists and was not written by this script: not replacing it (move it away to use this test cluster)"
	done
	mkdir -p "$CONF_DIR" "$STATE/slurmctld" "$STATE/slurmd" "$LOGS"
	cat >"$CONF_DIR/slurm.conf.new" <<EOF
$MARK
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
# a requeued job may start again cred_expire seconds after its requeue (SLURM's default: 120)
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
# no cgroups, no systemd: processes tracked by their parents, no CPU binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
# accounting: sacct answers how every job ended (submitit and hydratune's sweep wait read it)
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# a test cluster: schedule at once, forget finished jobs after 5 min, SIGKILL 30 s after SIGTERM
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
MinJobAge=300
KillWait=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
	if cmp -s "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf"; then
		rm "$CONF_DIR/slurm.conf.new"
	else
		mv "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf"
		RECONFIGURED=1
	fi
	if [[ ! -f $CONF_DIR/slurmdbd.conf ]]; then
		local password
		password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
		(
			umask 077
			cat >"$CONF_DIR/slurmdbd.conf" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$password
StorageLoc=slurm_acct_db
EOF
		)
	fi
}

start_munge() {
	if running /run/munge/munged.pid && munge -n | unmunge >/dev/null 2>&1; then return; fi
	install -d -o munge -g munge -m 0755 /run/munge
	[[ -s /etc/munge/munge.key ]] || {
		mungekey --create --keyfile=/etc/munge/munge.key
		chown munge:munge /etc/munge/munge.key
		chmod 0400 /etc/munge/munge.key
	}
	runuser -u munge -- /usr/sbin/munged --force
	wait_for 10 munged sh -c 'munge -n | unmunge'
}

start_mariadb() {
	if ! mariadb-admin --socket="$DB_SOCKET" ping >/dev/null 2>&1; then
		install -d -o mysql -g mysql -m 0755 /run/mysqld
		[[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql >/dev/null
		setsid mariadbd --user=mysql --socket="$DB_SOCKET" --skip-log-bin --innodb-buffer-pool-size=64M \
			>>"$LOGS/mariadb.log" 2>&1 </dev/null &
		wait_for 60 MariaDB mariadb-admin --socket="$DB_SOCKET" ping
	fi
	local password
	password=$(sed -n 's/^StoragePass=//p' "$CONF_DIR/slurmdbd.conf")
	mariadb --socket="$DB_SOCKET" <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$password';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF
}

start_slurmdbd() {
	running /run/slurmdbd.pid || slurmdbd
	wait_for 60 slurmdbd sacctmgr -n list cluster
	if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
		sacctmgr -i add cluster "$CLUSTER" >/dev/null
		sacctmgr -i add account "$CLUSTER" cluster="$CLUSTER" description=tests organization=hydratune >/dev/null
		sacctmgr -i add user root account="$CLUSTER" cluster="$CLUSTER" >/dev/null
	fi
}

start_slurm() {
	if ((RECONFIGURED)); then # a changed slurm.conf (this script's newer version): restart the daemons
		stop /run/slurmd.pid /run/slurmctld.pid
	fi
	running /run/slurmctld.pid || slurmctld
	wait_for 30 slurmctld scontrol ping
	running /run/slurmd.pid || slurmd
	# a node left down/drained by an earlier run (e.g. killed daemons) is returned to service
	wait_for 30 "the node" sh -c "sinfo -h -N -o %T | grep -Eq 'idle|mix|alloc|down|drain'"
	if sinfo -h -N -o %T | grep -Eq 'down|drain'; then
		scontrol update nodename="$(hostname -s)" state=resume
	fi
	wait_for 30 "an idle node" sh -c "sinfo -h -N -o %T | grep -Eq 'idle|mix|alloc'"
}

up() {
	[[ $(id -u) == 0 ]] || fail "needs root (it installs packages and starts system daemons): sudo $0 up"
	echo $$ >"$START_LOCK" # tests wait while a start is under way (CI starts the cluster in the background)
	trap 'rm -f "$START_LOCK"' EXIT
	[[ -r /etc/debian_version ]] || command -v slurmctld >/dev/null || fail "not a Debian-like system and SLURM is not installed"
	local start=$SECONDS
	install_packages
	write_configs
	start_munge
	start_mariadb
	start_slurmdbd
	start_slurm
	rm -f "$STATUS_FILE"
	say "up in $((SECONDS - start))s: $(sinfo -h -o '%P %D node(s) %C (alloc/idle/other/total CPUs) %T')"
}

status() {
	local name pid ok=0
	for name in munge/munged slurmdbd slurmctld slurmd mysqld/mysqld; do
		pid=/run/$name.pid
		if running "$pid"; then say "$(basename "$name"): running (pid $(cat "$pid"))"; else say "$(basename "$name"): not running"; fi
	done
	sinfo || ok=1
	sacctmgr -n -P list cluster format=cluster >/dev/null 2>&1 && say "accounting: answers" || {
		say "accounting: does not answer"
		ok=1
	}
	[[ -f $STATUS_FILE ]] && say "last failed start: $(cat "$STATUS_FILE")"
	return $ok
}

stop() { # stop <pid file>...: SIGTERM each daemon, wait up to 10 s for it to exit
	local pid n
	for pid in "$@"; do
		running "$pid" || continue
		kill "$(cat "$pid")"
		n=0
		while running "$pid" && ((n++ < 100)); do sleep 0.1; done
	done
}

down() {
	[[ $(id -u) == 0 ]] || fail "needs root: sudo $0 down"
	stop /run/slurmd.pid /run/slurmctld.pid /run/slurmdbd.pid /run/mysqld/mysqld.pid /run/munge/munged.pid
	say "stopped"
}

case "${1:-}" in
up) up ;;
status) status ;;
down) down ;;
*)
	echo "usage: $0 up|status|down" >&2
	exit 2
	;;
esac
