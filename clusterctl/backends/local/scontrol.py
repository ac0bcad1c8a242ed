"""scontrol for the local backend.

    scontrol show hostnames [EXPR]     (default $SLURM_JOB_NODELIST)
    scontrol show hostlist EXPR
    scontrol [-o] show job [-o] [ID]   key=value fields as Slurm 22.05 prints them
    scontrol requeue ID[,ID...]
    scontrol update jobid=ID ExcNodeList=NODES | StartTime=now
    scontrol update NodeName=NODES State=DOWN Reason=WHY | State=RESUME

Messages and exit codes follow Slurm 22.05 as measured on the test cluster.
"""

from __future__ import annotations

import grp
import os
import sys

from clusterctl.backends.local.control import ControlError, describe, find, requeue_job, update_job, update_nodes
from clusterctl.backends.local.formats import slurm_time
from clusterctl.backends.local.records import SubmitError, inventory, list_jobs, state_root
from clusterctl.syntax.hostlist import HostlistError, compress, expand

GLOBAL_FLAGS = {"-o": "oneliner", "--oneliner": "oneliner", "-d": "details", "--details": "details",
                "-Q": "quiet", "--quiet": "quiet", "-v": "verbose", "--verbose": "verbose"}


def err(message: str) -> None:
    print(message, file=sys.stderr)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def job_lines(info: dict) -> list[list[tuple[str, str]]]:
    """`scontrol show job` fields, one inner list per line of its multi-line form."""
    lines = [
        [("JobId", str(info["job_id"])), ("JobName", info["name"])],
        [("UserId", f"{info['user']}({info['uid']})"), ("GroupId", f"{_group(info['gid'])}({info['gid']})"),
         ("MCS_label", "N/A")],
        [("Priority", "1"), ("Nice", "0"), ("Account", info["account"]), ("QOS", "(null)")],
        [("JobState", info["state"]), ("Reason", info["reason"]), ("Dependency", info["dependency"])],
        [("Requeue", str(info["requeue"])), ("Restarts", str(info["restarts"])), ("BatchFlag", "1"), ("Reboot", "0"),
         ("ExitCode", info["exit_code"])],
        [("RunTime", slurm_time(info["run_time"])), ("TimeLimit", info["time_limit"]), ("TimeMin", "N/A")],
        [("SubmitTime", info["submit_time"]), ("EligibleTime", info["eligible_time"])],
        [("StartTime", info["start_time"]), ("EndTime", info["end_time"]), ("Deadline", "N/A")],
        [("Partition", info["partition"]), ("AllocNode:Sid", f"localhost:{os.getsid(0)}")],
        [("ReqNodeList", info["req_nodes"]), ("ExcNodeList", info["exc_nodes"])],
        [("NodeList", info["nodes"])],
        [("BatchHost", info["batch_host"] or "(null)")],
        [("NumNodes", str(info["num_nodes"])), ("NumCPUs", str(info["num_tasks"] * info["cpus_per_task"])),
         ("NumTasks", str(info["num_tasks"])), ("CPUs/Task", str(info["cpus_per_task"]))],
        [("NtasksPerN:B:S:C", f"{info['ntasks_per_node']}:0:*:*")],
        [("OverSubscribe", "OK"), ("Contiguous", "0"), ("Licenses", "(null)"), ("Network", "(null)")],
        [("Command", info["command"])],
        [("WorkDir", info["workdir"])],
        [("StdErr", info["stderr"])],
        [("StdIn", "/dev/null")],
        [("StdOut", info["stdout"])],
    ]
    if info["gres"]:
        lines.append([("TresPerNode", f"gres:gpu:{info['gpus_per_node']}")])
    return lines


def show_job(job: str | None, oneliner: bool) -> int:
    root = state_root()
    if job is None:
        records = list_jobs(root)
        if not records:
            print("No jobs in the system")
            return 0
    else:
        try:
            records = [find(root, job)]
        except ControlError as exc:
            err(f"slurm_load_jobs error: {exc}")
            return 1
    for record in records:
        lines = job_lines(describe(record))
        if oneliner:
            print(" ".join(f"{k}={v}" for line in lines for k, v in line) + " ")
        else:
            first, *rest = lines
            print(" ".join(f"{k}={v}" for k, v in first))
            for line in rest:
                print("   " + " ".join(f"{k}={v}" for k, v in line))
            print()
    return 0


def show(words: list[str], oneliner: bool) -> int:
    what = words[0].lower() if words else ""
    arg = words[1] if len(words) > 1 else None
    if what in ("hostnames", "hostname"):
        expr = arg if arg is not None else os.environ.get("SLURM_JOB_NODELIST", "")
        try:
            names = expand(expr)
        except HostlistError as exc:
            err(f"scontrol: error: {exc}")
            return 1
        if not names:
            err("scontrol: error: host list is empty")
            return 0
        print("\n".join(names))
        return 0
    if what == "hostlist":
        try:
            text = compress(expand(arg or ""))
        except HostlistError as exc:
            err(f"scontrol: error: {exc}")
            return 1
        if not text:
            err("scontrol: error: host list is empty")
            return 0
        print(text)
        return 0
    if what == "job":
        return show_job(arg, oneliner)
    err(f"invalid entity: {what or '(none)'} for keyword: show (the local backend emulates hostnames, hostlist, job)")
    return 1


def requeue(words: list[str]) -> int:
    if not words:
        err("scontrol: error: requeue needs a job id")
        return 1
    rc = 0
    for job in words[0].split(","):
        try:
            requeue_job(state_root(), job)
        except ControlError as exc:
            err(f"{exc} for job {job}")
            rc = 1
    return rc


def update(words: list[str]) -> int:
    fields: dict[str, str] = {}
    job = node = None
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            err(f"scontrol: error: invalid input: {word}")
            err("Request aborted")
            return 1
        if key.lower() == "jobid":
            job = value
        elif key.lower() == "nodename":
            node = value
        else:
            fields[key] = value
    if node is not None and job is None:
        try:
            update_nodes(state_root(), node, fields, inventory(os.environ))
        except (ControlError, SubmitError) as exc:
            err(str(exc))
            return 1
        return 0
    if job is None:
        err("scontrol: error: update needs jobid=ID or NodeName=NODES (what the local backend can update)")
        return 1
    try:
        update_job(state_root(), job, fields)
    except ControlError as exc:
        err(f"{exc} for job {job}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    flags = {GLOBAL_FLAGS[a] for a in args if a in GLOBAL_FLAGS}
    words = [a for a in args if a not in GLOBAL_FLAGS]
    if any(w.startswith("-") and w not in ("-",) and "=" not in w for w in words):
        bad = next(w for w in words if w.startswith("-"))
        err(f"scontrol: unrecognized option '{bad}'")
        err('Try "scontrol --help" for more information')
        return 1
    command = words[0].lower() if words else ""
    if command == "show":
        return show(words[1:], "oneliner" in flags)
    if command == "requeue":
        return requeue(words[1:])
    if command == "update":
        return update(words[1:])
    err(f"invalid keyword: {command or '(none)'} (the local backend emulates show, requeue, update)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
