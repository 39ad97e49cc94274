#!/usr/bin/env bash
# A self-contained single-machine Slurm 22.05 cluster (munge + MariaDB + slurmdbd + slurmctld + slurmd)
# for the project's tests and for trying the Slurm launcher on one machine.
#
#   launchers/slurm/local_cluster.sh start    # configure (first time) and start; prints the client env
#   launchers/slurm/local_cluster.sh status   # which daemons run, sinfo; exit 0 only if all run
#   launchers/slurm/local_cluster.sh env      # print the client env (export SLURM_CONF=...)
#   launchers/slurm/local_cluster.sh stop     # cancel jobs, stop every daemon it started, wait for exit
#
# Installs nothing: run launchers/slurm/install_debian.sh first.
# Every config, state, socket, pid and log file is under the state directory
# ($QWEN3_TRN_SLURM_DIR, default /tmp/qwen3_trn_slurm); nothing under /etc, /run or /var is used.
#
# Environment (read by `start` when nothing runs yet; written into the configs):
#   QWEN3_TRN_SLURM_DIR     state directory                         [/tmp/qwen3_trn_slurm]
#   QWEN3_TRN_SLURM_PORT    first of 4 TCP ports on 127.0.0.1:       [16817]
#                           slurmctld, slurmd, slurmdbd, MariaDB = PORT, PORT+1, PORT+2, PORT+3
#   QWEN3_TRN_SLURM_CPUS    CPUs the node advertises                 [nproc]; more than nproc
#                           oversubscribes the machine (SlurmdParameters=config_overrides)
#   QWEN3_TRN_SLURM_CLUSTER ClusterName (lowercase)                  [qwen3trn]
#   QWEN3_TRN_SLURM_TIMEOUT seconds to wait for each daemon / the node to be idle   [60]
#   QWEN3_TRN_SLURM_HOSTS   compute hosts                             [1]
#                           1: slurmd on this machine (NodeName = its hostname, 127.0.0.1).
#                           N>1: N compute hosts n<PORT>-1 .. n<PORT>-N, each slurmd in its own
#                           network + UTS namespace (own hostname and address 10.237.S.2 ..
#                           on a bridge q3b<PORT> whose host side, 10.237.S.1, is where slurmctld
#                           is reached; S = PORT/4 % 250), the names in /etc/hosts (a block
#                           marked with the state directory). Job steps and ranks run in their
#                           node's namespaces, so traffic between nodes goes over these addresses.
#                           `stop` removes the namespaces, veths, bridge and /etc/hosts lines.
#   QWEN3_TRN_SLURM_SUBNET  first three octets of the hosts' subnet   [10.237.S]
#   QWEN3_TRN_SLURM_FIRST_JOB_ID  the first job id (FirstJobId)        [1]; clusters used from one
#                           process (submitit caches job states by id) need ids of their own
#
# Needs root: the daemons run as root (SlurmUser=root; see README.md). Clients (sbatch, squeue,
# sacct, submitit) work for any user with SLURM_CONF=<state>/slurm.conf.
set -euo pipefail

STATE="${QWEN3_TRN_SLURM_DIR:-/tmp/qwen3_trn_slurm}"
case "$STATE" in /*) ;; *) STATE="$(pwd)/$STATE" ;; esac
STATE="${STATE%/}"
PORT="${QWEN3_TRN_SLURM_PORT:-16817}"
CLUSTER="${QWEN3_TRN_SLURM_CLUSTER:-qwen3trn}"
TIMEOUT="${QWEN3_TRN_SLURM_TIMEOUT:-60}"
ME="$(id -un)"
NODE="$(hostname -s)"
HOSTS_FILE="$STATE/hosts.env"
# The mode a cluster was started in is kept in the state directory: stop/status read it.
if [ -s "$HOSTS_FILE" ]; then
    # shellcheck disable=SC1090
    . "$HOSTS_FILE"
fi
HOSTS="${HOSTS:-${QWEN3_TRN_SLURM_HOSTS:-1}}"
case "$HOSTS" in '' | *[!0-9]* | 0) echo "local_cluster: ERROR: QWEN3_TRN_SLURM_HOSTS must be a number >= 1, not '$HOSTS'" >&2; exit 2 ;; esac
SUBNET="${SUBNET:-${QWEN3_TRN_SLURM_SUBNET:-10.237.$(((PORT / 4) % 250))}}"
BRIDGE="q3b$PORT"
HOST_ADDR="$SUBNET.1"
# compute host k (1..HOSTS): name, namespace, veth (host side; the peer is "eth0" in the namespace), address
host_name() { echo "n$PORT-$1"; }
host_ns() { echo "qwen3trn-$PORT-$1"; }
host_veth() { echo "q3v$PORT-$1"; }
host_addr() { echo "$SUBNET.$(($1 + 1))"; }
HOSTS_MARK="# qwen3_trn local_cluster $STATE"

CONF="$STATE/slurm.conf"
DBDCONF="$STATE/slurmdbd.conf"
LOG="$STATE/log"
RUN="$STATE/run"
MUNGE_DIR="$STATE/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
DB_DIR="$STATE/mysql"
DB_DATA="$DB_DIR/data"
DB_SOCKET="$DB_DIR/mysqld.sock"

export SLURM_CONF="$CONF"

# daemon name -> pid file (slurmd@NODE: the slurmd of compute host NODE)
pidfile() {
    case "$1" in
        munged) echo "$RUN/munged.pid" ;;
        mariadbd) echo "$RUN/mariadbd.pid" ;;
        slurmdbd) echo "$RUN/slurmdbd.pid" ;;
        slurmctld) echo "$RUN/slurmctld.pid" ;;
        slurmd) echo "$RUN/slurmd.pid" ;;
        slurmd@*) echo "$RUN/slurmd-${1#slurmd@}.pid" ;;
    esac
}
DAEMONS=(munged mariadbd slurmdbd slurmctld)
NODES=()
HOSTS_SUFFIX=""  # non-empty: one slurmd per host, its pid, log and spool files named after it
if [ "$HOSTS" -gt 1 ]; then HOSTS_SUFFIX=1; fi
if [ "$HOSTS" -eq 1 ]; then
    DAEMONS+=(slurmd)
    NODES=("$NODE")
else
    for k in $(seq 1 "$HOSTS"); do
        DAEMONS+=("slurmd@$(host_name "$k")")
        NODES+=("$(host_name "$k")")
    done
fi

log() { echo "local_cluster: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The pid of a running daemon (pid file present, process alive, and its name matches), else empty.
running_pid() {
    local name="$1" f pid comm
    f="$(pidfile "$name")"
    [ -s "$f" ] || return 0
    pid="$(tr -dc '0-9' <"$f")"
    [ -n "$pid" ] || return 0
    comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
    name="${name%%@*}"
    # /proc/PID/comm is cut to 15 characters
    if [ "$comm" = "${name:0:15}" ]; then echo "$pid"; fi
}

# Daemons of this state directory that their pid file does not name (a pid file deleted, a
# start that died half-way): "PID NAME" lines, found by a command line naming a file under the
# state directory or, for slurmdbd, SLURM_CONF=<state>/slurm.conf in its environment.
stray_pids() {
    local p comm pid d known=" "
    for d in "${DAEMONS[@]}"; do known="$known$(running_pid "$d") "; done
    for p in /proc/[0-9]*; do
        comm="$(cat "$p/comm" 2>/dev/null)" || continue
        case " munged mariadbd slurmdbd slurmctld slurmd " in *" $comm "*) ;; *) continue ;; esac
        pid="${p#/proc/}"
        case "$known" in *" $pid "*) continue ;; esac
        if tr '\0' '\n' 2>/dev/null <"$p/cmdline" | grep -qF "$STATE/" \
            || tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF "SLURM_CONF=$CONF"; then
            echo "$pid $comm"
        fi
    done
}

# Wait until a command succeeds; $1 = seconds, $2 = what (for the error), rest = command.
wait_for() {
    local secs="$1" what="$2"; shift 2
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            return 1
        fi
        sleep 0.2
    done
}

port_free() {
    # true if nothing listens on 127.0.0.1:$1 (bash's /dev/tcp: a refused connection means free)
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

check_installed() {
    local missing=()
    for b in munged mungekey mariadbd mariadb-install-db mariadb slurmdbd slurmctld slurmd sinfo sacctmgr sacct scontrol; do
        command -v "$b" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        die "not installed: ${missing[*]} (run launchers/slurm/install_debian.sh as root)"
    fi
}

# ---------------------------------------------------------------------------------------------
write_configs() {
    local cpus real_mem nproc_cpus mem_reported overrides="" dbpass slurm_user
    nproc_cpus="$(nproc)"
    cpus="${QWEN3_TRN_SLURM_CPUS:-$nproc_cpus}"
    if [ "$cpus" != "$nproc_cpus" ]; then
        overrides="SlurmdParameters=config_overrides"
    fi
    mem_reported="$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)"
    [ -n "$mem_reported" ] || mem_reported="$(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo)"
    # Below what slurmd reports, else slurmd registers with less memory than configured and the
    # node is drained ("Low RealMemory").
    real_mem=$((mem_reported * 9 / 10))
    # SlurmUser=root: the script runs as root anyway (slurmd must, to start jobs as their users),
    # and root needs no chown of the spool, log and state files or of slurmdbd.conf, nor the
    # slurm user's directories under /var. A production cluster uses a dedicated slurm user.
    slurm_user=root

    mkdir -p "$STATE" "$LOG" "$RUN" "$STATE/spool/slurmctld" "$MUNGE_DIR" "$DB_DIR"
    local n ctld_addr=127.0.0.1 node_lines="" nodes_list
    for n in "${NODES[@]}"; do mkdir -p "$STATE/spool/slurmd${HOSTS_SUFFIX:+-$n}"; done
    if [ "$HOSTS" -eq 1 ]; then
        node_lines="NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$NODE CPUs=$cpus RealMemory=$real_mem State=UNKNOWN"
    else
        # slurmd in a namespace reaches slurmctld on the bridge's host address
        ctld_addr="$HOST_ADDR"
        local k
        for k in $(seq 1 "$HOSTS"); do
            node_lines="${node_lines:+$node_lines
}NodeName=$(host_name "$k") NodeAddr=$(host_addr "$k") NodeHostname=$(host_name "$k") CPUs=$cpus RealMemory=$real_mem State=UNKNOWN"
        done
    fi
    nodes_list="$(IFS=,; echo "${NODES[*]}")"
    chmod 755 "$STATE"
    chmod 755 "$MUNGE_DIR"  # munged wants its socket directory searchable by all; the key is 600
    : >"$STATE/plugstack.conf"

    cat >"$CONF" <<EOF
# Written by launchers/slurm/local_cluster.sh: a cluster of $HOSTS compute host(s) on $NODE. Edits
# are lost on the next start from a stopped state.
ClusterName=$CLUSTER
FirstJobId=${QWEN3_TRN_SLURM_FIRST_JOB_ID:-1}
SlurmctldHost=$NODE($ctld_addr)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=$slurm_user
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job may start again cred_expire+1 s after it ended (default 120 s).
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=5
StateSaveLocation=$STATE/spool/slurmctld
SlurmdSpoolDir=$STATE/spool/slurmd${HOSTS_SUFFIX:+-%n}
SlurmctldPidFile=$(pidfile slurmctld)
SlurmdPidFile=$RUN/slurmd${HOSTS_SUFFIX:+-%n}.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd${HOSTS_SUFFIX:+-%n}.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$STATE/plugstack.conf
MailProg=/bin/true
MpiDefault=none
# No cgroups here (no systemd, containers): track processes by parent pid, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Without batch_sched_delay=0 the first batch job waits ~3 s; short intervals start a requeued
# job as soon as its BeginTime passes (else up to 30-60 s later).
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2
ReturnToService=2
# Jobs stay visible to squeue/scontrol for 5 minutes after they end; sacct keeps them for good.
MinJobAge=300
# Seconds between SIGTERM and SIGKILL on scancel / time limit (submitit ignores SIGTERM).
KillWait=5
InactiveLimit=0
SlurmctldTimeout=60
SlurmdTimeout=60
# Accounting through slurmdbd (submitit reads job states with sacct).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$((PORT + 2))
# The munge socket for connections to slurmdbd (AuthInfo only covers slurmctld/slurmd).
AccountingStoragePass=$MUNGE_SOCKET
JobCompType=jobcomp/none
# Preemption by QOS: a job with --qos=high preempts running jobs of QOS normal. The victim gets
# its --signal (submitit: USR2) at once (send_user_signal), is requeued, and starts again.
PreemptType=preempt/qos
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
PriorityType=priority/multifactor
PriorityWeightQOS=1000
$overrides
$node_lines
PartitionName=debug Nodes=$nodes_list Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes=$nodes_list Default=NO MaxTime=INFINITE State=UP
EOF

    if [ -s "$DB_DIR/slurm.password" ]; then
        dbpass="$(cat "$DB_DIR/slurm.password")"
    else
        dbpass="$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
        (umask 077 && printf '%s' "$dbpass" >"$DB_DIR/slurm.password")
    fi
    (umask 077 && cat >"$DBDCONF" <<EOF
# Written by launchers/slurm/local_cluster.sh
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$((PORT + 2))
SlurmUser=$slurm_user
PidFile=$(pidfile slurmdbd)
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((PORT + 3))
StorageUser=slurm
StoragePass=$dbpass
StorageLoc=slurm_acct_db
EOF
    )
    # slurmdbd refuses a slurmdbd.conf that others can read or that SlurmUser does not own.
    chmod 600 "$DBDCONF"
    chown "$slurm_user" "$DBDCONF"
}

# ---------------------------------------------------------------------------------------------
start_munged() {
    [ -z "$(running_pid munged)" ] || return 0
    if [ ! -s "$MUNGE_DIR/munge.key" ]; then
        mungekey --create --keyfile="$MUNGE_DIR/munge.key" >/dev/null
        chmod 600 "$MUNGE_DIR/munge.key"
    fi
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --log-file="$LOG/munged.log" --pid-file="$(pidfile munged)" --seed-file="$MUNGE_DIR/munged.seed" \
        || die "munged did not start; see $LOG/munged.log"
    wait_for "$TIMEOUT" munged bash -c "munge -S '$MUNGE_SOCKET' -n | unmunge -S '$MUNGE_SOCKET'" \
        || die "munged does not answer on $MUNGE_SOCKET; see $LOG/munged.log"
}

start_mariadbd() {
    [ -z "$(running_pid mariadbd)" ] || return 0
    local dbpass user_opt=()
    dbpass="$(cat "$DB_DIR/slurm.password")"
    if [ "$(id -u)" -eq 0 ]; then user_opt=(--user=root); fi
    # A throw-away accounting database: no fsync per transaction (creating slurmdbd's tables and
    # the first associations takes seconds instead of ~10 s), small redo log, no doublewrite.
    local fast=(--innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-log-file-size=16M
        --innodb-flush-method=nosync --skip-log-bin)
    if [ ! -d "$DB_DATA/mysql" ]; then
        rm -rf "$DB_DATA"
        mariadb-install-db --no-defaults --datadir="$DB_DATA" "${user_opt[@]}" --skip-test-db "${fast[@]}" \
            --auth-root-authentication-method=socket >"$LOG/mariadb-install-db.log" 2>&1 \
            || die "mariadb-install-db failed; see $LOG/mariadb-install-db.log"
    fi
    # --no-defaults: ignore /etc/mysql; pid file and socket in a directory this user owns.
    nohup mariadbd --no-defaults "${user_opt[@]}" --datadir="$DB_DATA" --socket="$DB_SOCKET" \
        --port=$((PORT + 3)) --bind-address=127.0.0.1 --skip-name-resolve \
        --pid-file="$(pidfile mariadbd)" --log-error="$LOG/mariadbd.log" \
        --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 --performance-schema=OFF "${fast[@]}" \
        </dev/null >>"$LOG/mariadbd.out" 2>&1 &
    wait_for "$TIMEOUT" mariadbd mariadb-admin --no-defaults --socket="$DB_SOCKET" -uroot ping \
        || die "mariadbd did not come up; see $LOG/mariadbd.log"
    # The database user of slurmdbd (root logs in through the socket as the system user root).
    mariadb --no-defaults --socket="$DB_SOCKET" -uroot <<EOF || die "could not create the slurmdbd database user"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$dbpass';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$dbpass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF
}

start_slurmdbd() {
    [ -z "$(running_pid slurmdbd)" ] || return 0
    slurmdbd >>"$LOG/slurmdbd.out" 2>&1 || die "slurmdbd did not start; see $LOG/slurmdbd.log"
    wait_for "$TIMEOUT" slurmdbd sacctmgr -n list cluster \
        || die "slurmdbd does not answer; see $LOG/slurmdbd.log"
}

register_accounting() {
    # The cluster (slurmctld registers itself with an existing cluster), an account and users so
    # that jobs have an association, and the preemption QOS. One sacctmgr reading commands from
    # stdin: what exists already is reported ("Nothing new added") and left alone.
    #
    # QOS for preemption: a job with --qos=high preempts jobs of the default QOS normal. The victim
    # gets its --signal at once (SlurmctldParameters=preempt_send_user_signal) and GraceTime
    # seconds to requeue itself (submitit runs `scontrol requeue` in its USR2 handler) before
    # Slurm requeues it and kills it. Without a GraceTime Slurm requeues the job at the same moment
    # and submitit's own `scontrol requeue` fails ("Job is pending execution"), failing the job.
    local u users cmds qos_cmds=""
    users="$(printf '%s\n' root "$ME" ${SUDO_USER:-} | sort -u)"
    cmds="add cluster $CLUSTER
add account local Cluster=$CLUSTER Description=local Organization=qwen3_trn
add qos high Priority=1000 Preempt=normal PreemptMode=requeue
modify qos normal set GraceTime=10"
    for u in $users; do
        # root has an association under account root from `add cluster`
        [ "$u" = root ] || cmds="$cmds
add user $u Account=local Cluster=$CLUSTER"
        qos_cmds="$qos_cmds
modify user $u set QOS+=high"
    done
    sacctmgr -i <<<"$cmds" >"$LOG/sacctmgr.out" 2>&1 || true
    # A second sacctmgr: the first one does not see the QOS it added.
    sacctmgr -i <<<"$qos_cmds" >>"$LOG/sacctmgr.out" 2>&1 || true
    [ -n "$(sacctmgr -n -P list cluster "$CLUSTER" format=cluster 2>/dev/null)" ] \
        && [ -n "$(sacctmgr -n -P list qos high format=name 2>/dev/null)" ] \
        || die "could not register cluster $CLUSTER in slurmdbd; see $LOG/sacctmgr.out and $LOG/slurmdbd.log"
}

start_slurmctld() {
    [ -z "$(running_pid slurmctld)" ] || return 0
    slurmctld -f "$CONF" >>"$LOG/slurmctld.out" 2>&1 || die "slurmctld did not start; see $LOG/slurmctld.log"
    wait_for "$TIMEOUT" slurmctld scontrol ping || die "slurmctld does not answer; see $LOG/slurmctld.log"
}

start_slurmd() {
    if [ "$HOSTS" -eq 1 ]; then
        [ -z "$(running_pid slurmd)" ] || return 0
        slurmd -f "$CONF" >>"$LOG/slurmd.out" 2>&1 || die "slurmd did not start; see $LOG/slurmd.log"
        return 0
    fi
    local k name
    for k in $(seq 1 "$HOSTS"); do
        name="$(host_name "$k")"
        [ -z "$(running_pid "slurmd@$name")" ] || continue
        # In the host's network namespace and a UTS namespace of its own with hostname = NodeName;
        # slurmd daemonizes in both, and its job steps and their processes inherit them.
        # (nsenter, not `ip netns exec`: that also makes a mount namespace with its own /sys, in
        # which slurmd finds no /sys/fs/cgroup; the mount namespace stays the host's.)
        nsenter --net="/run/netns/$(host_ns "$k")" unshare --uts sh -c 'hostname "$1" && exec slurmd -f "$2" -N "$1"' sh "$name" "$CONF" \
            >>"$LOG/slurmd-$name.out" 2>&1 || die "slurmd of $name did not start; see $LOG/slurmd-$name.log"
    done
}

# Compute hosts (HOSTS > 1): the bridge with the host address, one network namespace per host
# with a veth pair to the bridge, and the hosts' names in /etc/hosts (the ranks find the first
# node by its name, as on a real cluster). Recorded in hosts.env first, so that `stop` removes
# them also after a start that failed half-way.
setup_hosts() {
    [ "$HOSTS" -gt 1 ] || return 0
    command -v ip >/dev/null 2>&1 && command -v unshare >/dev/null 2>&1 && command -v nsenter >/dev/null 2>&1 \
        || die "QWEN3_TRN_SLURM_HOSTS=$HOSTS needs ip (iproute2), unshare and nsenter (util-linux)"
    printf 'HOSTS=%s\nSUBNET=%s\n' "$HOSTS" "$SUBNET" >"$HOSTS_FILE"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        if ip -o -4 addr show | grep -qF " $SUBNET."; then
            die "subnet $SUBNET.0/24 is in use on this machine (ip addr); set QWEN3_TRN_SLURM_SUBNET to other first three octets"
        fi
        ip link add "$BRIDGE" type bridge || die "could not create bridge $BRIDGE (network namespaces need root and CAP_NET_ADMIN)"
        ip addr add "$HOST_ADDR/24" dev "$BRIDGE"
        ip link set "$BRIDGE" up
    fi
    local k ns veth
    for k in $(seq 1 "$HOSTS"); do
        ns="$(host_ns "$k")"
        veth="$(host_veth "$k")"
        ip netns list | grep -qw "^$ns" && continue
        ip netns add "$ns" || die "could not create network namespace $ns"
        ip link add "$veth" type veth peer name "$veth-p" || die "could not create veth $veth"
        ip link set "$veth-p" netns "$ns"
        ip link set "$veth" master "$BRIDGE"
        ip link set "$veth" up
        ip netns exec "$ns" ip link set "$veth-p" name eth0
        ip netns exec "$ns" ip addr add "$(host_addr "$k")/24" dev eth0
        ip netns exec "$ns" ip link set eth0 up
        ip netns exec "$ns" ip link set lo up
    done
    if ! grep -qxF "$HOSTS_MARK" /etc/hosts; then
        {
            echo "$HOSTS_MARK"
            for k in $(seq 1 "$HOSTS"); do echo "$(host_addr "$k") $(host_name "$k")"; done
            echo "$HOST_ADDR $BRIDGE $HOSTS_MARK"
        } >>/etc/hosts
    fi
}

# Remove what setup_hosts made: processes left in the namespaces, the namespaces (and their
# veths), the bridge, the /etc/hosts lines.
teardown_hosts() {
    [ "$HOSTS" -gt 1 ] || return 0
    local k ns pids
    for k in $(seq 1 "$HOSTS"); do
        ns="$(host_ns "$k")"
        ip netns list | grep -qw "^$ns" || continue
        pids="$(ip netns pids "$ns" 2>/dev/null | xargs)"
        if [ -n "$pids" ]; then
            log "stopping processes left in $ns: $pids"
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null || true
            wait_for 10 "processes in $ns" bash -c "[ -z \"\$(ip netns pids $ns)\" ]" \
                || { pids="$(ip netns pids "$ns" 2>/dev/null | xargs)"; [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true; }
        fi
        ip netns del "$ns" 2>/dev/null || true
        ip link del "$(host_veth "$k")" 2>/dev/null || true
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE" 2>/dev/null || true; fi
    if grep -qF "$HOSTS_MARK" /etc/hosts; then
        # rewritten in place: /etc/hosts may be a mount point
        local kept
        kept="$(awk -v mark="$HOSTS_MARK" '$0 == mark { skip = 1; next } skip && index($0, mark) { skip = 0; next } !skip' /etc/hosts)"
        printf '%s\n' "$kept" >/etc/hosts
    fi
}

# The node is up: idle (or running jobs when the cluster was already up) and not drained or
# unresponsive; with an epoch argument, slurmd must also have registered since then (a restarted
# slurmctld restores the node's last state from its state files before slurmd registers).
node_idle() {
    local n
    for n in "${NODES[@]}"; do one_node_idle "$n" "${1:-}" || return 1; done
}

one_node_idle() {
    local line state started
    line="$(scontrol show node -o "$1" 2>/dev/null)" || return 1
    state="$(sed -n 's/.* State=\([^ ]*\).*/\1/p' <<<"$line")"
    grep -qxE '(IDLE|MIXED|ALLOCATED)(\+COMPLETING)?' <<<"$state" || return 1
    if [ -n "${2:-}" ]; then
        started="$(sed -n 's/.* SlurmdStartTime=\([^ ]*\).*/\1/p' <<<"$line")"
        started="$(date -d "$started" +%s 2>/dev/null)" || return 1
        [ "$started" -ge "$(($2 - 1))" ] || return 1
    fi
}

cluster_in_db() {
    # slurmctld registered with slurmdbd: the cluster row has its control host and port
    sacctmgr -n -P list cluster "$CLUSTER" format=ControlHost 2>/dev/null | grep -q .
}

print_env() {
    echo "export SLURM_CONF=$CONF"
}

all_running() {
    local d
    for d in "${DAEMONS[@]}"; do
        [ -n "$(running_pid "$d")" ] || return 1
    done
}

any_running() {
    local d
    for d in "${DAEMONS[@]}"; do
        [ -z "$(running_pid "$d")" ] || return 0
    done
    return 1
}

cmd_start() {
    check_installed
    if [ "$(id -u)" -ne 0 ]; then
        die "run as root (sudo $0 start): slurmd starts each job as the user who submitted it, and the daemons run with SlurmUser=root"
    fi
    if all_running && node_idle; then
        log "already running in $STATE"
        print_env
        return 0
    fi
    local t0=$SECONDS
    if [ -n "$(stray_pids)" ]; then
        die "daemons of $STATE run without pid files ($(stray_pids | xargs)); run '$0 stop' first"
    fi
    if ! any_running; then
        # Nothing ran before: if this start fails, stop what it started (the logs stay).
        trap 'rc=$?; trap - EXIT; if [ "$rc" -ne 0 ]; then log "start failed; stopping what it started"; cmd_stop || true; fi; exit "$rc"' EXIT
        local p
        for p in "$PORT" $((PORT + 1)) $((PORT + 2)) $((PORT + 3)); do
            port_free "$p" || die "port $p on 127.0.0.1 is in use; set QWEN3_TRN_SLURM_PORT to another base port"
        done
        write_configs
    elif [ ! -f "$CONF" ]; then
        die "daemons from $STATE run but $CONF is missing; run '$0 stop' first"
    else
        log "some daemons already run in $STATE; starting the others"
    fi
    setup_hosts
    start_munged
    start_mariadbd
    start_slurmdbd
    register_accounting
    start_slurmctld
    local t_slurmd="" d
    for d in "${DAEMONS[@]}"; do
        case "$d" in slurmd*) if [ -z "$(running_pid "$d")" ]; then t_slurmd="$(date +%s)"; fi ;; esac
    done
    start_slurmd
    wait_for "$TIMEOUT" "node idle" node_idle "$t_slurmd" \
        || die "not every node of ${NODES[*]} is idle: $(sinfo -h -N -o '%N %T %E' 2>&1 | xargs); see $LOG/slurmd*.log and $LOG/slurmctld.log"
    wait_for "$TIMEOUT" "cluster registered" cluster_in_db \
        || die "slurmctld did not register cluster $CLUSTER with slurmdbd; see $LOG/slurmctld.log"
    trap - EXIT
    log "started in $((SECONDS - t0)) s: node(s) ${NODES[*]} idle, partitions debug (default) and cpu, state in $STATE"
    print_env
}

# Send SIGTERM to the named daemons, then wait (up to 30 s, then SIGKILL) until all have exited.
# The pids are read before signalling: slurmctld removes its pid file before it exits.
stop_daemons() {
    local name pid names=() pids=()
    for name in "$@"; do
        pid="$(running_pid "$name")"
        rm -f "$(pidfile "$name")"
        if [ -n "$pid" ]; then
            kill -TERM "$pid" 2>/dev/null || true
            names+=("$name")
            pids+=("$pid")
        fi
    done
    local i deadline=$((SECONDS + 30)) left
    while :; do
        left=0
        for i in "${!pids[@]}"; do
            if [ "$(cat "/proc/${pids[$i]}/comm" 2>/dev/null || true)" = "${names[$i]:0:15}" ]; then
                left=1
                if [ "$SECONDS" -ge "$deadline" ]; then
                    log "${names[$i]} (pid ${pids[$i]}) ignored SIGTERM for 30 s; sending SIGKILL"
                    kill -KILL "${pids[$i]}" 2>/dev/null || true
                fi
            fi
        done
        [ "$left" -eq 1 ] || break
        sleep 0.1
    done
}

cmd_stop() {
    local t0=$SECONDS
    if [ -n "$(running_pid slurmctld)" ]; then
        # Cancel what is left so no job step outlives slurmd; wait for the jobs to end.
        local jobs
        jobs="$(squeue -h -o '%i' 2>/dev/null || true)"
        if [ -n "$jobs" ]; then
            log "cancelling jobs: $(echo $jobs)"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            wait_for 20 "jobs to end" bash -c '[ -z "$(squeue -h -o %i 2>/dev/null)" ]' || log "jobs still listed: $(squeue -h 2>&1)"
        fi
    fi
    # slurmctld sends what accounting it still holds to slurmdbd, so slurmdbd (and its database)
    # go after it; munged last, as the others use it while they shut down.
    local slurmds=() d
    for d in "${DAEMONS[@]}"; do case "$d" in slurmd*) slurmds+=("$d") ;; esac; done
    stop_daemons "${slurmds[@]}" slurmctld
    stop_daemons slurmdbd
    stop_daemons mariadbd munged
    local strays
    strays="$(stray_pids)"
    if [ -n "$strays" ]; then
        log "stopping daemons of $STATE without a pid file: $(echo $strays)"
        local pid name
        while read -r pid name; do kill -TERM "$pid" 2>/dev/null || true; done <<<"$strays"
        wait_for 30 "strays to exit" bash -c "! kill -0 $(awk '{print $1}' <<<"$strays" | xargs) 2>/dev/null" \
            || { log "sending SIGKILL"; while read -r pid name; do kill -KILL "$pid" 2>/dev/null || true; done <<<"$strays"; }
    fi
    teardown_hosts
    rm -f "$HOSTS_FILE"
    log "stopped in $((SECONDS - t0)) s ($STATE)"
}

cmd_status() {
    # exit 0: all running; 3: nothing running; 1: partly running
    local d pid n=0 strays
    echo "state directory: $STATE"
    for d in "${DAEMONS[@]}"; do
        pid="$(running_pid "$d")"
        if [ -n "$pid" ]; then
            echo "  $d: running (pid $pid)"
            n=$((n + 1))
        else
            echo "  $d: stopped"
        fi
    done
    strays="$(stray_pids)"
    if [ -n "$strays" ]; then
        echo "  running without a pid file: $(echo $strays)"
    fi
    if [ -n "$(running_pid slurmctld)" ] && [ -f "$CONF" ]; then
        sinfo 2>&1 | sed 's/^/  /'
    fi
    if [ "$n" -eq "${#DAEMONS[@]}" ] && [ -z "$strays" ]; then
        echo "running"
        print_env
    elif [ "$n" -eq 0 ] && [ -z "$strays" ]; then
        echo "stopped"
        return 3
    elif [ -n "$strays" ]; then
        echo "partly running (run 'stop', then 'start')"
        return 1
    else
        echo "partly running ('start' starts the rest; 'stop' stops all)"
        return 1
    fi
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) print_env ;;
    *)
        echo "usage: $0 start|stop|status|env   (state directory: \$QWEN3_TRN_SLURM_DIR, default /tmp/qwen3_trn_slurm)" >&2
        exit 2
        ;;
esac
