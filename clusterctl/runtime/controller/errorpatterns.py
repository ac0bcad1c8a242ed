"""What a rank's error text says about whose fault it is: the one list of patterns the blame reads.

A rank reports its error as text (a Python traceback, `SystemExit(2)`, a
CUDA or NCCL message). The blame (runtime/controller/blame.py) sorts each into one of:

* a peer's failure seen from here (`PEER_FAILURE`): gloo or NCCL saying a
  connection closed, a collective or the store timing out, a communicator
  aborted. Victims' errors: never a cause, and never "the same exception on
  every rank";
* hardware or the fabric (`HARDWARE`): an uncorrectable ECC error, an Xid,
  "unspecified launch failure", a NIC or InfiniBand error. Names the node,
  whatever the other ranks raised;
* shared infrastructure (`INFRASTRUCTURE`): a file system that is full,
  read-only, stale or failing, a store that cannot be reached. The same on
  every rank, it is nobody's node and gets one restart;
* a Python error of the kind that stops a script before its first step
  (`EARLY_ERRORS`): syntax, imports, a missing file, argparse's exit 2. The
  script's when it comes before the rank's first step.

Everything else is the script's own exception: the script's fault when
every rank (or ranks of every node) raised the same one, ambiguous when one
rank did. `signature` is what "the same" means: the exception's type and
message with numbers (rank numbers, addresses, sizes) set aside.
Standard library only: the controller imports this.
"""

from __future__ import annotations

import re

PEER_FAILURE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|EPIPE"
    r"|NCCL communicator was aborted|ProcessGroupNCCL.*(timed out|Watchdog)|Socket Timeout|timed out|Timeout"
    r"|remote process exited|peer.*(closed|died|exited)|ncclRemoteError|Application timeout caused pair closure"
    r"|DistNetworkError|DistStoreError",
    re.I,
)
HARDWARE = re.compile(
    r"uncorrectable ECC error|ECC error|\bXid\b|unspecified launch failure|GPU is lost|fallen off the bus"
    r"|cudaErrorECCUncorrectable|NVML_ERROR_GPU_IS_LOST|NVLink error|nvlink.*(fatal|error)"
    r"|ncclSystemError.*(ibv_|IB|mlx5|NIC)|ibv_\w+ failed|IBV_WC_\w+_ERR|mlx5\S*: .*error|NET/IB.*error"
    r"|Machine check|hardware error",
    re.I,
)
INFRASTRUCTURE = re.compile(
    r"No space left on device|Disk quota exceeded|Read-only file system|Stale file handle|Input/output error"
    r"|Transport endpoint is not connected|Errno (28|30|116|5|122)\b",
    re.I,
)
EARLY_ERRORS = (
    "SyntaxError", "IndentationError", "TabError", "ImportError", "ModuleNotFoundError", "FileNotFoundError",
)
ARGPARSE_EXIT = "SystemExit(2)"  # argparse's own exit for a bad command line
# Script errors whose fix is known, and what to say about it in the verdict (docs/guide/own-script.md).
HINTS = (
    (re.compile(r"invalid device ordinal", re.I),
     "each rank sees one GPU, its own, as device 0: torch.cuda.set_device(LOCAL_RANK) names one it cannot see;"
     " use set_device(LOCAL_RANK % torch.cuda.device_count()), or device cuda"),
)
_NUMBER = re.compile(r"0x[0-9a-fA-F]+|\d+(\.\d+)?")
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)|[A-Z]\w*)(: |$)")


def last_line(text: str) -> str:
    """The line that names the exception: a traceback's last line, else a message's first one (300 characters)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines and lines[0].startswith("Traceback") else lines[0] if lines else "")[:300]


def exception_type(text: str) -> str:
    """The exception's type (`ValueError`, `torch.OutOfMemoryError`), its last dotted part; '' when none shows."""
    line = last_line(text)
    if line.startswith("SystemExit("):
        return "SystemExit"
    found = _EXCEPTION.match(line)
    return found.group("type").rsplit(".", 1)[-1] if found else ""


def signature(text: str) -> str:
    """What makes two ranks' errors "the same": the exception line with every number replaced by N."""
    return _NUMBER.sub("N", last_line(text))


def hint(text: str) -> str:
    """What fixes a script error of a known kind, or ""."""
    return next((said for pattern, said in HINTS if pattern.search(text)), "")


def is_peer_failure(text: str) -> bool:
    """A peer's failure seen from here: the rank that reports it is a victim."""
    return bool(PEER_FAILURE.search(text))


def is_hardware(text: str) -> bool:
    return bool(HARDWARE.search(text))


def is_infrastructure(text: str) -> bool:
    return bool(INFRASTRUCTURE.search(text))


def is_early(text: str) -> bool:
    """An error of the script that no node causes and no restart cures: syntax, imports, a missing file, argparse."""
    return exception_type(text) in EARLY_ERRORS or last_line(text) == ARGPARSE_EXIT
