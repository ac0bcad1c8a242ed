"""squeue for the local backend: `squeue [-h] [-j IDS] [-t STATES] [-u USER | --me] [-o FORMAT]`.

As in Slurm 22.05 (measured): only pending, running and completing jobs are
listed unless --states says otherwise (also with --jobs), and asking for a job
id that was never submitted is an error. Format fields: %i %A %j %u %T %t %M
%l %D %N %R %r %P %V %S %e %Z %o %a %b %C %%, with Slurm's `%.8i` (right) and
`%8i` (left) widths, which also truncate.
"""

from __future__ import annotations

import re
import sys

from clusterctl.backends.local.control import ControlError, describe, find
from clusterctl.backends.local.formats import slurm_time
from clusterctl.backends.local.records import SHORT_STATE, list_jobs, state_root, user_name

DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
DEFAULT_STATES = {"PENDING", "RUNNING", "COMPLETING", "REQUEUED"}
HEADERS = {
    "i": "JOBID", "A": "JOBID", "j": "NAME", "u": "USER", "T": "STATE", "t": "ST", "M": "TIME",
    "l": "TIME_LIMIT", "D": "NODES", "N": "NODELIST", "R": "NODELIST(REASON)", "r": "REASON",
    "P": "PARTITION", "V": "SUBMIT_TIME", "S": "START_TIME", "e": "END_TIME", "Z": "WORK_DIR",
    "o": "COMMAND", "a": "ACCOUNT", "b": "TRES_PER_NODE", "C": "CPUS",
}
_FIELD = re.compile(r"%(\.?)(\d*)([A-Za-z%])")


def err(message: str) -> None:
    print(message, file=sys.stderr)


def squeue_time(seconds: float) -> str:
    """squeue's durations: 0:02, 1:08, 1:02:03, 2-01:02:03."""
    text = slurm_time(seconds)
    if "-" in text:
        return text
    hours, minutes, secs = text.split(":")
    return f"{int(hours)}:{minutes}:{secs}" if int(hours) else f"{int(minutes)}:{secs}"


def value(code: str, info: dict) -> str:
    state = info["state"]
    pending = state == "PENDING"
    if code in "iA":
        return str(info["job_id"])
    if code == "R":
        if pending or (state not in DEFAULT_STATES and info["reason"] != "None"):
            return f"({info['reason']})"
        return info["nodes"]
    limit = info["time_limit"]
    table = {
        "j": info["name"], "u": info["user"], "T": state, "t": SHORT_STATE.get(state, state[:2]),
        "M": squeue_time(info["run_time"]), "D": str(info["num_nodes"]),
        "l": limit if limit == "UNLIMITED" else squeue_time(_seconds(limit)),
        "N": "" if info["nodes"] == "(null)" else info["nodes"], "r": info["reason"], "P": info["partition"],
        "V": info["submit_time"], "S": info["start_time"] if not pending else "N/A", "e": info["end_time"],
        "Z": info["workdir"], "o": info["command"], "a": info["account"],
        "b": f"gres:gpu:{info['gpus_per_node']}" if info["gres"] else "N/A",
        "C": str(info["num_tasks"] * info["cpus_per_task"]), "%": "%",
    }
    return table[code]


def _seconds(text: str) -> int:
    days, _, rest = text.rpartition("-")
    h, m, s = (int(x) for x in rest.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def render(fmt: str, row: dict | None) -> str:
    out, pos = [], 0
    for match in _FIELD.finditer(fmt):
        out.append(fmt[pos:match.start()])
        pos = match.end()
        right, width, code = match.groups()
        text = HEADERS[code] if row is None and code != "%" else ("%" if code == "%" else value(code, row))
        if width:
            text = text[: int(width)]
            text = text.rjust(int(width)) if right else text.ljust(int(width))
        out.append(text)
    out.append(fmt[pos:])
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    header, fmt = True, DEFAULT_FORMAT
    jobs: list[str] | None = None
    states: set[str] | None = None
    users: set[str] | None = None
    i = 0
    valued = {"-j": "jobs", "--jobs": "jobs", "-o": "format", "--format": "format",
              "-t": "states", "--states": "states", "-u": "user", "--user": "user"}
    while i < len(args):
        arg = args[i]
        i += 1
        name, _, val = arg.partition("=") if arg.startswith("--") else (arg[:2], "", arg[2:])
        if arg in ("-h", "--noheader"):
            header = False
            continue
        if arg in ("--me",):
            users = {user_name()}
            continue
        if arg in ("-a", "--all"):
            continue
        if name not in valued:
            err(f"squeue: unrecognized option '{arg}' (the local backend emulates -h -j -t -u --me -o)")
            err('Try "squeue --help" for more information')
            return 1
        if not val:
            if i >= len(args):
                err(f"squeue: option '{arg}' requires an argument")
                return 1
            val = args[i]
            i += 1
        kind = valued[name]
        if kind == "jobs":
            jobs = [j for j in val.split(",") if j]
        elif kind == "format":
            fmt = val
        elif kind == "states":
            states = {s.strip().upper() for s in val.split(",")}
        else:
            users = set(val.split(","))
    bad = [m.group(3) for m in _FIELD.finditer(fmt) if m.group(3) not in HEADERS and m.group(3) != "%"]
    if bad:
        err(f"Invalid job format specification: {bad[0]}")
        return 1
    root = state_root()
    if jobs is not None:
        try:
            records = [find(root, j) for j in jobs]
        except ControlError as exc:
            err(f"slurm_load_jobs error: {exc}")
            return 1
    else:
        records = list_jobs(root)
    if states is not None and "ALL" not in states:
        long_names = {short: name for name, short in SHORT_STATE.items()}
        states = {long_names.get(s, s) for s in states}
    if header:
        print(render(fmt, None))
    for record in records:
        info = describe(record)
        wanted = DEFAULT_STATES if states is None else states
        if "ALL" not in wanted and info["state"] not in wanted:
            continue
        if users is not None and info["user"] not in users:
            continue
        print(render(fmt, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
