#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine, for the test suite.
#
#   lab.sh install   install the Debian packages (slurmctld, slurmd, client, munge)
#   lab.sh up        install if needed, then start munged, slurmctld and 4 slurmd
#                    (nodes n1..n4) from a private state dir; wait until idle
#   lab.sh down      cancel the lab's jobs, stop its daemons, remove the state dir
#   lab.sh status    print sinfo/squeue; exit 0 if the lab is up, 3 if not
#   lab.sh env       print `export SLURM_CONF=...` lines, for
#                    eval "$(tests/slurmlab/lab.sh env)"
#   lab.sh kill-node NODE
#                    lose NODE for real: SIGKILL its slurmd, its slurmstepds and
#                    every process of a job on it; slurmctld marks it DOWN
#                    (Not responding) SlurmdTimeout (5 s) to 2x that later
#   lab.sh revive NODE
#                    start NODE's slurmd again, resume it, wait until it is up
#
# Everything lives under $CLUSTERCTL_LAB_DIR (default /tmp/clusterctl-slurmlab):
# no files in /etc/slurm, /etc/munge, /run or /etc/hosts are written.
# Node names n1..n4 do not resolve through DNS: all nodes are 127.0.0.1.
#
# Ports (override with CLUSTERCTL_LAB_CTLD_PORT / CLUSTERCTL_LAB_SLURMD_PORT):
#   slurmctld 16817, slurmd n1..n4 16901..16904.
set -euo pipefail

STATE="${CLUSTERCTL_LAB_DIR:-/tmp/clusterctl-slurmlab}"
CTLD_PORT="${CLUSTERCTL_LAB_CTLD_PORT:-16817}"
SLURMD_PORT="${CLUSTERCTL_LAB_SLURMD_PORT:-16901}"
UP_TIMEOUT="${CLUSTERCTL_LAB_UP_TIMEOUT:-30}"
# Seconds without an answer from a slurmd before slurmctld marks its node DOWN
# (Slurm's default is 300; slurmctld pings every SlurmdTimeout/3 s).
SLURMD_TIMEOUT="${CLUSTERCTL_LAB_SLURMD_TIMEOUT:-5}"

NODES=(n1 n2 n3 n4)
GPUS_PER_NODE=4
# libslurm38: the library pyslurm (the optional query path) links; slurm-client does not pull it in.
PACKAGES=(slurmctld slurmd slurm-client munge libslurm38)
MARKER_NAME=".clusterctl-slurmlab"

# Inherited Slurm job/client variables (for example when this runs inside a
# job of a real cluster) would redirect our client commands: drop them.
while IFS= read -r _var; do
    unset "$_var"
done < <(compgen -e | grep -E '^(SLURM|SBATCH|SALLOC|SRUN|SQUEUE|SINFO)_' || true)
unset _var

log() { printf 'slurmlab: %s\n' "$*"; }
warn() { printf 'slurmlab: %s\n' "$*" >&2; }
die() {
    printf 'slurmlab: ERROR: %s\n' "$*" >&2
    exit 1
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

set_paths() {
    case "$STATE" in
    /*) ;;
    *) STATE="$PWD/$STATE" ;;
    esac
    STATE="${STATE%/}"
    [[ -n "$STATE" && "$STATE" != "/" ]] || die "refusing to use / as the state dir"
    CONF="$STATE/slurm.conf"
    MARKER="$STATE/$MARKER_NAME"
    RUN="$STATE/run"
    LOGDIR="$STATE/log"
    MUNGE_DIR="$STATE/munge"
    MUNGE_KEY="$MUNGE_DIR/munge.key"
    MUNGE_SOCK="$RUN/munge.socket"
    MUNGE_PID="$RUN/munged.pid"
    CTLD_PID="$RUN/slurmctld.pid"
    GPU_DIR="$STATE/dev"
    LOCKFILE="$STATE.lock"
    export SLURM_CONF="$CONF"
}

slurmd_pidfile() { printf '%s/slurmd-%s.pid' "$RUN" "$1"; }
# Present while a node is lost on purpose (kill-node): the lab still counts as up.
killed_marker() { printf '%s/killed-%s' "$RUN" "$1"; }
node_killed() { [[ -e "$(killed_marker "$1")" ]]; }

# ---------------------------------------------------------------- processes

# pid_of PIDFILE COMM: print the pid if the process is alive and is COMM.
pid_of() {
    local pidfile="$1" comm="$2" pid actual
    [[ -r "$pidfile" ]] || return 1
    pid="$(tr -dc '0-9' <"$pidfile")"
    [[ -n "$pid" ]] || return 1
    [[ -r "/proc/$pid/comm" ]] || return 1
    actual="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
    [[ "$actual" == "$comm" ]] || return 1
    running "$pid" || return 1
    printf '%s\n' "$pid"
}

# running PID: the process exists and is not a zombie (its state letter
# follows the command name, which may hold spaces).
running() {
    [[ "$({ sed 's/.*) //' "/proc/$1/stat"; } 2>/dev/null)" == [RSDTtW]\ * ]]
}

# stop_pids SECONDS PID...: SIGTERM, wait, then SIGKILL what is left.
stop_pids() {
    local wait_s="$1" pid deadline left
    shift
    (($# > 0)) || return 0
    for pid in "$@"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    deadline=$((SECONDS + wait_s))
    while ((SECONDS <= deadline)); do
        left=0
        for pid in "$@"; do
            if kill -0 "$pid" 2>/dev/null; then left=1; fi
        done
        ((left)) || return 0
        sleep 0.1
    done
    for pid in "$@"; do
        if kill -0 "$pid" 2>/dev/null; then
            warn "pid $pid did not stop on SIGTERM, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
}

# descendants PID: print all descendants of PID (children first level first).
descendants() {
    local parent="$1" child
    while IFS= read -r child; do
        printf '%s\n' "$child"
        descendants "$child"
    done < <(grep -s -H '^PPid:' /proc/[0-9]*/status |
        awk -v p="$parent" '$2 == p { split($1, a, "/"); print a[3] }')
}

# Leftover step daemons of this lab: slurmstepd processes whose environment
# carries this lab's SLURM_CONF (slurmd is started with it exported).
lab_stepds() {
    local d comm
    for d in /proc/[0-9]*; do
        { read -r comm <"$d/comm"; } 2>/dev/null || continue
        [[ "$comm" == "slurmstepd" ]] || continue
        if grep -qzxF "SLURM_CONF=$CONF" "$d/environ" 2>/dev/null; then
            printf '%s\n' "${d#/proc/}"
        fi
    done
}

# port_listening PORT: true if something listens on TCP PORT (v4 or v6).
port_listening() {
    local hex
    hex="$(printf '%04X' "$1")"
    awk -v h=":$hex" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == h { found = 1 }
        END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# ---------------------------------------------------------------- install

packages_missing() {
    local p status
    for p in "${PACKAGES[@]}"; do
        status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
        [[ "$status" == "install ok installed" ]] || printf '%s\n' "$p"
    done
}

binaries_present() {
    local b
    for b in slurmctld slurmd sinfo squeue sbatch srun scancel scontrol munged munge; do
        command -v "$b" >/dev/null 2>&1 || [[ -x "/usr/sbin/$b" ]] || return 1
    done
}

cmd_install() {
    local missing t0
    missing="$(packages_missing)"
    if [[ -z "$missing" ]] && binaries_present; then
        log "packages already installed: ${PACKAGES[*]}"
        return 0
    fi
    [[ "$(id -u)" == 0 ]] || die "installing Slurm needs root (missing: $(echo "$missing" | tr '\n' ' '))"
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found: cannot install ${PACKAGES[*]}"
    t0="$(now)"
    log "installing: ${PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get -o DPkg::Lock::Timeout=300 -qq update; then
        die "apt-get update failed (no network or no apt mirror reachable?)"
    fi
    # Without systemd the packages' postinst scripts cannot start the system
    # services; apt may report that as an error. Only the end state counts.
    if ! apt-get -o DPkg::Lock::Timeout=300 -qq install -y --no-install-recommends \
        "${PACKAGES[@]}" >"${TMPDIR:-/tmp}/clusterctl-slurmlab-apt.log" 2>&1; then
        warn "apt-get install reported an error (often only a service start in a postinst); checking"
        dpkg --configure -a >/dev/null 2>&1 || true
    fi
    missing="$(packages_missing)"
    if [[ -n "$missing" ]] || ! binaries_present; then
        tail -n 30 "${TMPDIR:-/tmp}/clusterctl-slurmlab-apt.log" >&2 || true
        die "could not install: $(echo "$missing" | tr '\n' ' ')"
    fi
    rm -f "${TMPDIR:-/tmp}/clusterctl-slurmlab-apt.log"
    log "packages installed in $(elapsed "$t0") s"
}

# ---------------------------------------------------------------- health

ctld_responds() {
    [[ "$(scontrol ping 2>/dev/null || true)" == *"is UP"* ]]
}

# node_states: "name state" for the lab nodes, as sinfo reports them.
node_states() {
    { sinfo -h -N -p gpu -o '%N %T' 2>/dev/null || true; } | sort -u
}

count_nodes_in() {
    # count_nodes_in REGEX: number of lab nodes whose state matches REGEX.
    node_states | awk -v re="$1" '$2 ~ re { n++ } END { print n + 0 }'
}

daemons_alive() {
    local n
    pid_of "$MUNGE_PID" munged >/dev/null || return 1
    pid_of "$CTLD_PID" slurmctld >/dev/null || return 1
    for n in "${NODES[@]}"; do
        node_killed "$n" && continue
        pid_of "$(slurmd_pidfile "$n")" slurmd >/dev/null || return 1
    done
}

killed_nodes() {
    local n
    for n in "${NODES[@]}"; do
        if node_killed "$n"; then printf '%s\n' "$n"; fi
    done
}

lab_healthy() {
    local killed usable
    [[ -f "$MARKER" && -f "$CONF" ]] || return 1
    daemons_alive || return 1
    ctld_responds || return 1
    # Usable: every node responding and not down/drained (busy is fine), but
    # for the nodes lost on purpose with kill-node (until `revive`), so that
    # another test run does not tear the lab down meanwhile.
    killed="$(killed_nodes | wc -l)"
    usable="$(count_nodes_in '^(idle|allocated|mixed|completing)$')"
    ((usable + killed >= ${#NODES[@]}))
}

any_lab_daemon_alive() {
    local n
    pid_of "$MUNGE_PID" munged >/dev/null && return 0
    pid_of "$CTLD_PID" slurmctld >/dev/null && return 0
    for n in "${NODES[@]}"; do
        pid_of "$(slurmd_pidfile "$n")" slurmd >/dev/null && return 0
    done
    return 1
}

show_logs() {
    local f
    for f in "$LOGDIR"/*.log "$LOGDIR"/*.out; do
        [[ -s "$f" ]] || continue
        printf '\n==== tail %s ====\n' "$f" >&2
        tail -n 25 "$f" >&2 || true
    done
}

# ---------------------------------------------------------------- config

slurm_conf_text() {
    local host i n port nodelist last
    host="$(hostname -s 2>/dev/null || hostname)"
    last=$((${#NODES[@]}))
    nodelist="n[1-$last]"

    cat <<EOF
# Generated by tests/slurmlab/lab.sh: a single-host multi-node test cluster.
ClusterName=clusterctl-lab
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${MUNGE_SOCK},cred_expire=5
StateSaveLocation=${STATE}/ctld
SlurmdSpoolDir=${STATE}/spool/%n
SlurmctldPidFile=${CTLD_PID}
SlurmdPidFile=${RUN}/slurmd-%n.pid
SlurmctldLogFile=${LOGDIR}/slurmctld.log
SlurmdLogFile=${LOGDIR}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1,batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=${STATE}/jobcomp.txt
MailProg=/bin/true
JobRequeue=1
KillWait=2
MinJobAge=600
ReturnToService=2
SlurmdTimeout=${SLURMD_TIMEOUT}
InactiveLimit=0
GresTypes=gpu
TopologyPlugin=topology/tree
EOF
    for i in "${!NODES[@]}"; do
        n="${NODES[$i]}"
        port=$((SLURMD_PORT + i))
        printf 'NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%s CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=16000 Gres=gpu:%s State=UNKNOWN\n' \
            "$n" "$host" "$port" "$GPUS_PER_NODE"
    done
    printf 'PartitionName=gpu Nodes=%s Default=YES MaxTime=INFINITE State=UP\n' "$nodelist"
}

# refresh_config: a lab started by an older lab.sh gets this script's
# slurm.conf (only settings that `scontrol reconfigure` applies have changed
# since: SlurmdTimeout).
refresh_config() {
    [[ -f "$CONF" ]] || return 0
    if slurm_conf_text | cmp -s - "$CONF"; then
        return 0
    fi
    log "updating $CONF (SlurmdTimeout=${SLURMD_TIMEOUT}) and reconfiguring"
    slurm_conf_text >"$CONF.new"
    mv -f "$CONF.new" "$CONF"
    scontrol reconfigure >/dev/null || die "scontrol reconfigure failed"
}

write_configs() {
    local nodelist="n[1-${#NODES[@]}]"
    slurm_conf_text >"$CONF"

    cat >"$STATE/gres.conf" <<EOF
AutoDetect=off
NodeName=${nodelist} Name=gpu File=${GPU_DIR}/gpu[0-$((GPUS_PER_NODE - 1))]
EOF

    cat >"$STATE/topology.conf" <<EOF
SwitchName=leaf1 Nodes=n[1-2]
SwitchName=leaf2 Nodes=n[3-4]
SwitchName=spine Switches=leaf[1-2]
EOF

    cat >"$STATE/env" <<EOF
export SLURM_CONF=$(printf '%q' "$CONF")
export CLUSTERCTL_LAB_DIR=$(printf '%q' "$STATE")
EOF
}

make_gpu_files() {
    local k f
    mkdir -p "$GPU_DIR"
    for ((k = 0; k < GPUS_PER_NODE; k++)); do
        f="$GPU_DIR/gpu$k"
        [[ -e "$f" ]] && continue
        # A character device like /dev/null; fall back to a plain file where
        # mknod is not permitted (Slurm only needs the path to exist).
        mknod "$f" c 1 3 2>/dev/null || touch "$f"
        chmod 666 "$f"
    done
}

# ---------------------------------------------------------------- up

start_munged() {
    local deadline
    if [[ ! -s "$MUNGE_KEY" ]]; then
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile="$MUNGE_KEY" >/dev/null
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
        fi
        chmod 600 "$MUNGE_KEY"
    fi
    munged --force --key-file="$MUNGE_KEY" --socket="$MUNGE_SOCK" \
        --pid-file="$MUNGE_PID" --log-file="$LOGDIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" \
        </dev/null >>"$LOGDIR/munged.out" 2>&1 9>&- || {
        show_logs
        die "munged failed to start"
    }
    deadline=$((SECONDS + 10))
    until munge -n -S "$MUNGE_SOCK" 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1; do
        if ((SECONDS > deadline)); then
            show_logs
            die "munged does not answer on $MUNGE_SOCK"
        fi
        sleep 0.1
    done
}

start_slurmctld() {
    local deadline
    slurmctld -f "$CONF" -i </dev/null >>"$LOGDIR/slurmctld.out" 2>&1 9>&- || {
        show_logs
        die "slurmctld failed to start"
    }
    local start=$SECONDS
    deadline=$((SECONDS + 15))
    until ctld_responds; do
        if ((SECONDS > deadline)); then
            show_logs
            die "slurmctld does not answer on port $CTLD_PORT"
        fi
        if ((SECONDS - start >= 3)) && ! pid_of "$CTLD_PID" slurmctld >/dev/null; then
            show_logs
            die "slurmctld exited during startup"
        fi
        sleep 0.1
    done
}

start_slurmds() {
    local n
    for n in "${NODES[@]}"; do
        mkdir -p "$STATE/spool/$n"
        slurmd -f "$CONF" -N "$n" </dev/null >>"$LOGDIR/slurmd-$n.out" 2>&1 9>&- || {
            show_logs
            die "slurmd for node $n failed to start"
        }
    done
}

wait_idle() {
    local deadline idle
    deadline=$((SECONDS + UP_TIMEOUT))
    while :; do
        idle="$(count_nodes_in '^idle$')"
        [[ "$idle" == "${#NODES[@]}" ]] && return 0
        if ((SECONDS > deadline)); then
            warn "nodes not idle after ${UP_TIMEOUT} s:"
            sinfo -N -p gpu -o '%N %T %E' >&2 2>&1 || true
            return 1
        fi
        sleep 0.2
    done
}

check_ports() {
    local i port
    for port in "$CTLD_PORT" $(for i in "${!NODES[@]}"; do echo $((SLURMD_PORT + i)); done); do
        if port_listening "$port"; then
            die "TCP port $port is already in use (set CLUSTERCTL_LAB_CTLD_PORT / CLUSTERCTL_LAB_SLURMD_PORT to move the lab)"
        fi
    done
}

cmd_up() {
    local t0 t1
    t0="$(now)"
    [[ "$(id -u)" == 0 ]] || die "the Slurm lab needs root (slurmd runs jobs as root and installs packages)"
    if lab_healthy; then
        refresh_config
        log "lab already up and healthy ($STATE)"
        return 0
    fi
    if [[ -e "$STATE" && ! -f "$MARKER" ]]; then
        die "$STATE exists but is not a lab state dir (no $MARKER_NAME); not touching it"
    fi
    if [[ -e "$STATE" ]]; then
        log "found a stale or partial lab in $STATE: tearing it down first"
        do_down
    fi
    cmd_install
    check_ports
    ((${#MUNGE_SOCK} < 100)) || die "state dir path too long for a unix socket: $MUNGE_SOCK"

    t1="$(now)"
    log "creating state dir $STATE"
    mkdir -p "$STATE"
    : >"$MARKER"
    mkdir -p "$RUN" "$LOGDIR" "$STATE/ctld" "$STATE/spool"
    install -d -m 700 "$MUNGE_DIR"
    make_gpu_files
    write_configs

    log "starting munged (socket $MUNGE_SOCK)"
    start_munged
    log "starting slurmctld (port $CTLD_PORT)"
    start_slurmctld
    log "starting slurmd ${NODES[*]} (ports $SLURMD_PORT..$((SLURMD_PORT + ${#NODES[@]} - 1)))"
    start_slurmds
    log "waiting up to ${UP_TIMEOUT} s for ${#NODES[@]} idle nodes"
    if ! wait_idle; then
        show_logs
        stop_daemons
        die "lab did not come up; logs kept in $LOGDIR (run 'lab.sh down' to remove)"
    fi
    log "lab up: ${#NODES[@]} idle nodes in $(elapsed "$t1") s (total $(elapsed "$t0") s)"
    log "use it with: eval \"\$($0 env)\"   (SLURM_CONF=$CONF)"
}

# ---------------------------------------------------------------- down

cancel_jobs() {
    local jobs deadline
    pid_of "$CTLD_PID" slurmctld >/dev/null || return 0
    ctld_responds || return 0
    jobs="$(squeue -h -o '%A' 2>/dev/null | sort -u | tr '\n' ' ' || true)"
    [[ -n "${jobs// /}" ]] || return 0
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086 # word splitting of the job list is intended
    scancel $jobs 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while ((SECONDS <= deadline)); do
        [[ -z "$(squeue -h -t PD,CF,R,CG,S,ST,SI,SE -o '%A' 2>/dev/null)" ]] && return 0
        sleep 0.2
    done
    warn "jobs still active after 10 s; stopping the daemons anyway"
}

stop_daemons() {
    local n pid pids=() strays=()
    for n in "${NODES[@]}"; do
        if pid="$(pid_of "$(slurmd_pidfile "$n")" slurmd)"; then pids+=("$pid"); fi
    done
    if pid="$(pid_of "$CTLD_PID" slurmctld)"; then pids+=("$pid"); fi
    if ((${#pids[@]})); then
        # slurmd and slurmctld stop in about 2 s each: stop them together.
        log "stopping slurmd and slurmctld (pids ${pids[*]})"
        stop_pids 10 "${pids[@]}"
    fi
    # Job steps survive slurmd: kill what is left of this lab's steps.
    for pid in $(lab_stepds); do
        strays+=("$pid")
        while IFS= read -r n; do strays+=("$n"); done < <(descendants "$pid")
    done
    if ((${#strays[@]})); then
        warn "killing leftover job processes of this lab: ${strays[*]}"
        kill -KILL "${strays[@]}" 2>/dev/null || true
    fi
    if pid="$(pid_of "$MUNGE_PID" munged)"; then
        log "stopping munged (pid $pid)"
        stop_pids 10 "$pid"
    fi
}

do_down() {
    if [[ ! -e "$STATE" ]]; then
        log "nothing to stop: $STATE does not exist"
        return 0
    fi
    if [[ ! -f "$MARKER" ]]; then
        die "$STATE exists but is not a lab state dir (no $MARKER_NAME); not touching it"
    fi
    cancel_jobs
    stop_daemons
    rm -rf -- "$STATE"
    log "lab down, removed $STATE"
}

cmd_down() {
    local t0
    t0="$(now)"
    do_down
    log "down took $(elapsed "$t0") s"
}

# ---------------------------------------------------------------- node loss

check_node() {
    local n
    for n in "${NODES[@]}"; do
        [[ "$n" == "$1" ]] && return 0
    done
    die "unknown node '${1}' (lab nodes: ${NODES[*]})"
}

# node_stepds NODE: this lab's slurmstepds of NODE. A slurmstepd's environment
# does not name its node, but it keeps its node's slurmd log file open.
node_stepds() {
    local pid log="$LOGDIR/slurmd-$1.log"
    for pid in $(lab_stepds); do
        if [[ "$(readlink -f "/proc/$pid/fd/"* 2>/dev/null)" == *"$log"* ]]; then
            printf '%s\n' "$pid"
        fi
    done
}

# node_job_pids NODE: processes of this lab's jobs on NODE (their environment
# has SLURMD_NODENAME=NODE and this lab's SLURM_CONF), also ones that left
# their slurmstepd's process tree.
node_job_pids() {
    local files f
    mapfile -t files < <(grep -lzxF "SLURMD_NODENAME=$1" /proc/[0-9]*/environ 2>/dev/null || true)
    ((${#files[@]})) || return 0
    for f in $(grep -lzxF "SLURM_CONF=$CONF" "${files[@]}" 2>/dev/null || true); do
        f="${f#/proc/}"
        f="${f%/environ}"
        [[ "$f" == "$$" || "$f" == "$BASHPID" ]] || printf '%s\n' "$f"
    done
}

# node_victims NODE: everything that dies with NODE (zombies left out).
node_victims() {
    local pid
    {
        if pid="$(pid_of "$(slurmd_pidfile "$1")" slurmd)"; then printf '%s\n' "$pid"; fi
        for pid in $(node_stepds "$1"); do
            printf '%s\n' "$pid"
            descendants "$pid"
        done
        node_job_pids "$1"
    } | sort -un | while IFS= read -r pid; do
        if running "$pid"; then printf '%s\n' "$pid"; fi
    done
}

cmd_kill_node() {
    local node="${1:-}" _ victims all=() first="" pid deadline
    [[ -n "$node" ]] || die "usage: lab.sh kill-node NODE"
    check_node "$node"
    lab_healthy || die "the lab is not up ($STATE)"
    refresh_config
    : >"$(killed_marker "$node")"
    # A few passes: processes forked while the first ones were being killed.
    for _ in 1 2 3 4 5; do
        mapfile -t victims < <(node_victims "$node")
        ((${#victims[@]})) || break
        [[ -n "$first" ]] || first="$(now)"
        kill -KILL "${victims[@]}" 2>/dev/null || true
        all+=("${victims[@]}")
        sleep 0.05
    done
    # Return once they are gone (a dying slurmd would pass for a live one).
    deadline=$((SECONDS + 5))
    for pid in "${all[@]}"; do
        while running "$pid" && ((SECONDS <= deadline)); do sleep 0.05; done
    done
    log "killed node $node at ${first:-$(now)} (epoch s): pids ${all[*]:-(none)}"
}

cmd_revive() {
    local node="${1:-}" deadline state
    [[ -n "$node" ]] || die "usage: lab.sh revive NODE"
    check_node "$node"
    [[ -f "$MARKER" ]] || die "the lab is not up ($STATE)"
    if ! pid_of "$(slurmd_pidfile "$node")" slurmd >/dev/null; then
        mkdir -p "$STATE/spool/$node"
        slurmd -f "$CONF" -N "$node" </dev/null >>"$LOGDIR/slurmd-$node.out" 2>&1 9>&- || {
            show_logs
            die "slurmd for node $node failed to start"
        }
    fi
    deadline=$((SECONDS + UP_TIMEOUT))
    until pid_of "$(slurmd_pidfile "$node")" slurmd >/dev/null; do
        ((SECONDS <= deadline)) || die "slurmd for node $node did not write its pidfile"
        sleep 0.1
    done
    while :; do
        # (a `*` suffix means not responding; a busy node is fine: other
        # test runs' jobs may have started on it already)
        state="$(sinfo -h -n "$node" -o '%T' 2>/dev/null | head -n 1)"
        [[ "$state" =~ ^(idle|mixed|allocated|completing)$ ]] && break
        # ReturnToService=2 returns a node that was DOWN for not responding
        # as soon as its slurmd registers; RESUME covers the other cases.
        if [[ "$state" == down* || "$state" == drain* ]]; then
            scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
        fi
        if ((SECONDS > deadline)); then
            sinfo -N -n "$node" -o '%N %T %E' >&2 || true
            die "node $node not back after ${UP_TIMEOUT} s"
        fi
        sleep 0.2
    done
    rm -f "$(killed_marker "$node")"
    log "node $node is $state again"
}

# ---------------------------------------------------------------- status/env

cmd_status() {
    if ! lab_healthy; then
        if [[ -f "$MARKER" ]] && any_lab_daemon_alive; then
            log "lab in $STATE is only partly up"
            sinfo -N -o '%N %T %E' 2>&1 || true
        else
            log "lab is not up ($STATE)"
        fi
        return 3
    fi
    log "lab up ($STATE, SLURM_CONF=$CONF)"
    if [[ -n "$(killed_nodes)" ]]; then
        log "lost on purpose (lab.sh revive NODE brings back): $(killed_nodes | tr '\n' ' ')"
    fi
    sinfo -N -o '%N %P %T %c %G'
    squeue -o '%.8i %.10P %.20j %.10T %.6D %R'
}

cmd_env() {
    printf 'export SLURM_CONF=%q\n' "$CONF"
    printf 'export CLUSTERCTL_LAB_DIR=%q\n' "$STATE"
}

with_lock() {
    # Serialise up/down/install between concurrent callers (two test runs).
    mkdir -p "$(dirname "$LOCKFILE")"
    exec 9>>"$LOCKFILE"
    if ! flock -w 600 9; then
        die "timed out waiting for $LOCKFILE"
    fi
    "$@"
}

usage() {
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
}

main() {
    set_paths
    case "${1:-}" in
    install) with_lock cmd_install ;;
    up) with_lock cmd_up ;;
    down) with_lock cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    kill-node) with_lock cmd_kill_node "${2:-}" ;;
    revive) with_lock cmd_revive "${2:-}" ;;
    -h | --help | help) usage ;;
    *)
        usage >&2
        exit 2
        ;;
    esac
}

main "$@"
