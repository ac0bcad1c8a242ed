"""sbatch's options, from `#SBATCH` lines and from its command line.

Only what the local backend emulates is accepted; anything else is an error
naming the option, never silently ignored, so a script that works locally
does not depend on an option the emulation dropped. Parsing follows sbatch:
directives are read up to the first line that is neither blank nor a comment,
`--opt=value` and `--opt value` and `-X value` / `-Xvalue` all work, and the
command line overrides the script.
"""

from __future__ import annotations

import re
import shlex
import signal
from dataclasses import dataclass, field

from clusterctl.syntax.hostlist import HostlistError, expand


class OptionError(ValueError):
    """An option sbatch would reject, or one this emulation does not support."""


# long name -> (short letter or "", takes a value: "yes" | "no" | "optional")
OPTIONS: dict[str, tuple[str, str]] = {
    "job-name": ("J", "yes"),
    "nodes": ("N", "yes"),
    "ntasks": ("n", "yes"),
    "ntasks-per-node": ("", "yes"),
    "gpus-per-node": ("", "yes"),
    "gres": ("", "yes"),
    "cpus-per-task": ("c", "yes"),
    "exclusive": ("", "optional"),
    "oversubscribe": ("s", "no"),
    "time": ("t", "yes"),
    "exclude": ("x", "yes"),
    "nodelist": ("w", "yes"),
    "requeue": ("", "no"),
    "no-requeue": ("", "no"),
    "no-kill": ("k", "optional"),
    "signal": ("", "yes"),
    "open-mode": ("", "yes"),
    "output": ("o", "yes"),
    "error": ("e", "yes"),
    "partition": ("p", "yes"),
    "account": ("A", "yes"),
    "switches": ("", "yes"),
    "segment": ("", "yes"),
    "constraint": ("C", "yes"),
    "dependency": ("d", "yes"),
    "chdir": ("D", "yes"),
    "export": ("", "yes"),
    "parsable": ("", "no"),
}
SHORT = {short: name for name, (short, _) in OPTIONS.items() if short}
_COMMAND_LINE_ONLY = {"parsable"}
_DEPENDENCY_TYPES = ("afterany", "afterok", "afternotok")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_SIGNAL_SPEC = re.compile(r"^(?:([A-Za-z]+):)?([A-Za-z0-9]+)(?:@(\d+))?$")


@dataclass
class Request:
    """What a job asked for. Times are in emulated seconds; None means not given."""

    name: str | None = None
    nodes: int = 1
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_node: int = 0
    gpu_option: str = ""  # --gpus-per-node or --gres, for scontrol's TresPerNode
    cpus_per_task: int | None = None
    exclusive: bool = False
    time_limit: int | None = None  # seconds; None = no limit
    exclude: list[str] = field(default_factory=list)
    nodelist: list[str] = field(default_factory=list)
    requeue: bool = True  # JobRequeue=1, as on the test cluster
    no_kill: bool = False  # --no-kill: the job keeps running when one of its nodes fails
    signal: dict | None = None  # {"num", "name", "lead", "batch"}
    open_mode: str = "truncate"
    open_mode_given: bool = False
    output: str | None = None
    error: str | None = None
    partition: str | None = None
    account: str | None = None
    switches: str | None = None
    segment: int | None = None  # Slurm 24.05's --segment: checked against --nodes and recorded (no blocks here)
    dependency: list[list] = field(default_factory=list)  # [type, job id]
    chdir: str | None = None
    parsable: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict) -> Request:
        return cls(**data)


def directives(script_text: str) -> list[str]:
    """The arguments of the script's `#SBATCH` lines, in order, up to its first command."""
    args: list[str] = []
    for number, line in enumerate(script_text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        if not line.startswith("#SBATCH"):
            continue
        rest = line[len("#SBATCH"):]
        if rest and not rest[0].isspace():
            continue  # #SBATCHX is a comment to sbatch
        try:
            args.extend(shlex.split(rest, comments=True))
        except ValueError as exc:
            raise OptionError(f"line {number}: cannot parse #SBATCH line {line!r}: {exc}") from None
    return args


def split_options(argv: list[str], where: str) -> list[tuple[str, str | None]]:
    """(long name, value) pairs; raises OptionError for an unknown or malformed option."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            spec = OPTIONS.get(name)
            if spec is None:
                raise OptionError(f"unrecognized option '--{name}' {where} (the local backend does not emulate it)")
            kind = spec[1]
            if kind == "no" and eq:
                raise OptionError(f"option '--{name}' {where} takes no value")
            if kind == "yes" and not eq:
                if i >= len(argv):
                    raise OptionError(f"option '--{name}' {where} requires a value")
                value = argv[i]
                i += 1
            out.append((name, value if (eq or kind == "yes") else None))
        elif arg.startswith("-") and len(arg) > 1:
            letter = arg[1]
            name = SHORT.get(letter)
            if name is None:
                raise OptionError(f"invalid option -- '{letter}' {where} (the local backend does not emulate it)")
            if OPTIONS[name][1] == "no":
                if len(arg) > 2:
                    raise OptionError(f"option '-{letter}' {where} takes no value")
                out.append((name, None))
                continue
            if OPTIONS[name][1] == "optional":  # getopt's optional argument: only attached (-koff)
                out.append((name, arg[2:] or None))
                continue
            value = arg[2:]
            if not value:
                if i >= len(argv):
                    raise OptionError(f"option '-{letter}' {where} requires a value")
                value = argv[i]
                i += 1
            out.append((name, value))
        else:
            raise OptionError(f"unexpected argument {arg!r} {where}")
    return out


def parse_time(text: str) -> int | None:
    """Seconds from Slurm's time formats (bare number = minutes); None for no limit."""
    value = text.strip()
    if value.upper() in ("UNLIMITED", "INFINITE", "-1"):
        return None
    match = _TIME.match(value)
    if not match:
        raise OptionError(f"invalid time limit {text!r}: expected MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    days, a, b, c = match.groups()
    if days is not None:
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:
        seconds = int(a) * 60 + int(b)
    else:
        seconds = int(a) * 60
    return seconds or None  # --time=0 means no limit


def signal_number(text: str) -> int:
    """USR2, SIGUSR2 or 12 -> 12."""
    name = text.upper()
    if name.isdigit():
        num = int(name)
        if num < 1 or num >= signal.NSIG:
            raise OptionError(f"invalid signal number {text!r}")
        return num
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(getattr(signal.Signals, name))
    except AttributeError:
        raise OptionError(f"invalid signal name {text!r}") from None


def parse_signal(text: str) -> dict:
    """`[B:]SIG[@SECONDS]` (the lead defaults to 60 s, as in sbatch)."""
    match = _SIGNAL_SPEC.match(text)
    if not match:
        raise OptionError(f"invalid --signal {text!r}: expected [B:]SIG[@SECONDS]")
    flags, sig, lead = match.groups()
    flags = (flags or "").upper()
    if set(flags) - {"B"}:
        raise OptionError(f"--signal {text!r}: only the B: flag is emulated (got {flags}:)")
    num = signal_number(sig)
    return {"num": num, "name": signal.Signals(num).name[3:], "lead": int(lead) if lead else 60, "batch": "B" in flags}


def _positive(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise OptionError(f"invalid --{name} {value!r}: expected a positive integer") from None
    if number < 1:
        raise OptionError(f"invalid --{name} {value!r}: expected a positive integer")
    return number


def _gpus(name: str, value: str) -> int:
    parts = value.split(":")
    if name == "gres":
        if parts[0] != "gpu" or len(parts) > 3:
            raise OptionError(f"--gres={value}: only gpu[:type]:count is emulated")
        count = parts[-1] if len(parts) > 1 else "1"
    else:
        if len(parts) > 2:
            raise OptionError(f"invalid --gpus-per-node {value!r}: expected [type:]count")
        count = parts[-1]
    return _positive(name, count)


def _hosts(name: str, value: str) -> list[str]:
    try:
        return expand(value)
    except HostlistError as exc:
        raise OptionError(f"--{name}: {exc}") from None


def parse_dependency(value: str) -> list[list]:
    deps = []
    for item in value.split(","):
        kind, _, ids = item.partition(":")
        if kind not in _DEPENDENCY_TYPES or not ids:
            raise OptionError(
                f"invalid --dependency {value!r}: the local backend emulates {', '.join(_DEPENDENCY_TYPES)} (TYPE:JOBID[:JOBID])"
            )
        for job in ids.split(":"):
            if not job.isdigit():
                raise OptionError(f"invalid --dependency {value!r}: {job!r} is not a job id")
            deps.append([kind, int(job)])
    return deps


def apply(request: Request, pairs: list[tuple[str, str | None]], where: str) -> None:
    """Set the request's fields from parsed options (later ones win, as in sbatch)."""
    for name, value in pairs:
        if name in _COMMAND_LINE_ONLY and where != "on the command line":
            raise OptionError(f"option '--{name}' {where} is only valid on sbatch's command line")
        text = value if value is not None else ""
        if name == "job-name":
            request.name = text
        elif name == "nodes":
            low = text.split("-")[0]  # min[-max]: the emulation allocates the minimum
            request.nodes = _positive(name, low)
        elif name == "ntasks":
            request.ntasks = _positive(name, text)
        elif name == "ntasks-per-node":
            request.ntasks_per_node = _positive(name, text)
        elif name in ("gpus-per-node", "gres"):
            request.gpus_per_node = _gpus(name, text)
            request.gpu_option = f"{name}:{text}"
        elif name == "cpus-per-task":
            request.cpus_per_task = _positive(name, text)
        elif name == "exclusive":
            request.exclusive = True
        elif name == "oversubscribe":
            request.exclusive = False
        elif name == "time":
            request.time_limit = parse_time(text)
        elif name == "exclude":
            request.exclude = _hosts(name, text)
        elif name == "nodelist":
            request.nodelist = _hosts(name, text)
        elif name == "requeue":
            request.requeue = True
        elif name == "no-requeue":
            request.requeue = False
        elif name == "no-kill":
            if text not in ("", "off"):
                raise OptionError(f"invalid --no-kill argument {text!r}: expected off or nothing")
            request.no_kill = text != "off"
        elif name == "signal":
            request.signal = parse_signal(text)
        elif name == "open-mode":
            if text not in ("append", "truncate"):
                raise OptionError(f"invalid --open-mode {text!r}: expected append or truncate")
            request.open_mode = text
            request.open_mode_given = True
        elif name == "output":
            request.output = text
        elif name == "error":
            request.error = text
        elif name == "partition":
            request.partition = text
        elif name == "account":
            request.account = text
        elif name == "switches":
            request.switches = text  # recorded; emulated nodes have no switch tree
        elif name == "segment":
            request.segment = _positive(name, text)  # recorded; emulated nodes have no blocks to keep it in
        elif name == "constraint":
            if text:
                raise OptionError(f"--constraint={text}: emulated nodes have no features (Invalid feature specification)")
        elif name == "dependency":
            request.dependency = parse_dependency(text) if text else []
        elif name == "chdir":
            request.chdir = text
        elif name == "export":
            if text.split(",")[0] != "ALL":
                raise OptionError(f"--export={text}: only ALL (optionally ALL,VAR=value) is emulated")
        elif name == "parsable":
            request.parsable = True


def parse_request(script_text: str, command_line: list[str]) -> Request:
    """The request of a script submitted with `command_line` options (the command line wins)."""
    request = Request()
    apply(request, split_options(directives(script_text), "in an #SBATCH line"), "in an #SBATCH line")
    apply(request, split_options(command_line, "on the command line"), "on the command line")
    if request.segment and request.nodes and request.nodes > request.segment and request.nodes % request.segment:
        raise OptionError(f"--segment={request.segment}: {request.nodes} nodes are not a whole number of segments"
                          " (Requested node configuration is not available)")
    return request


def expand_pattern(pattern: str, *, job_id: int, name: str, user: str, node: str, task: int = 0,
                   step: str = "batch", node_index: int = 0) -> str:
    """sbatch/srun file name patterns: %j %J %x %u %N %n %t %s %A %a %%."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch != "%" or i + 1 >= len(pattern):
            out.append(ch)
            i += 1
            continue
        j = i + 1
        width = ""
        while j < len(pattern) and pattern[j].isdigit():
            width += pattern[j]
            j += 1
        if j >= len(pattern):
            out.append(pattern[i:])
            break
        code = pattern[j]
        numbers = {"j": job_id, "A": job_id, "t": task, "n": node_index, "a": 4294967294}
        texts = {"x": name, "u": user, "N": node, "s": step, "J": f"{job_id}.{step}"}
        if code in numbers:
            out.append(str(numbers[code]).zfill(int(width or 0)))
        elif code in texts:
            out.append(texts[code])
        elif code == "%":
            out.append("%")
        else:
            out.append(pattern[i : j + 1])
        i = j + 1
    return "".join(out)
