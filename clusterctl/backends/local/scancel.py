"""scancel for the local backend: `scancel [--signal=SIG] [--batch | --full] [--quiet] JOBID...`.

Without --signal the job is cancelled: every process of it gets SIGCONT and
SIGTERM, SIGKILL KillWait (2 s) later, and it ends CANCELLED. With --signal
the signal goes to every process of the job's running srun steps, with
--batch to the batch shell only, with --full to both. As in Slurm 22.05,
cancelling an unknown or finished job succeeds silently, while signalling an
unknown job is an error.
"""

from __future__ import annotations

import sys

from clusterctl.backends.local.batchopts import OptionError, signal_number
from clusterctl.backends.local.control import ControlError, cancel_job, find, signal_job
from clusterctl.backends.local.records import state_root


def err(message: str) -> None:
    print(message, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    sig: int | None = None
    batch = full = False
    jobs: list[str] = []
    i = 0
    try:
        while i < len(args):
            arg = args[i]
            i += 1
            if arg in ("-b", "--batch"):
                batch = True
            elif arg in ("-f", "--full"):
                full = True
            elif arg in ("-Q", "--quiet", "-v", "--verbose"):
                pass
            elif arg.startswith("--signal="):
                sig = signal_number(arg.split("=", 1)[1])
            elif arg in ("-s", "--signal"):
                if i >= len(args):
                    err(f"scancel: option '{arg}' requires an argument")
                    return 1
                sig = signal_number(args[i])
                i += 1
            elif arg.startswith("-s") and len(arg) > 2:
                sig = signal_number(arg[2:])
            elif arg.startswith("-"):
                err(f"scancel: unrecognized option '{arg}' (the local backend emulates --signal, --batch, --full, --quiet)")
                err('Try "scancel --help" for more information')
                return 1
            else:
                jobs.extend(j for j in arg.split(",") if j)
    except OptionError as exc:
        err(f"scancel: error: {exc}")
        return 1
    if not jobs:
        err("scancel: error: No job identification provided")
        return 1
    root = state_root()
    rc = 0
    for job in jobs:
        if not job.isdigit():
            err(f"scancel: error: Invalid job id {job} (job steps and arrays are not emulated)")
            rc = 1
            continue
        try:
            if sig is None:
                cancel_job(root, job)
            else:
                find(root, job)
                signal_job(root, job, sig, batch=batch, full=full)
        except ControlError as exc:
            err(f"scancel: error: Kill job error on job id {job}: {exc}")
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
