"""sbatch for the local backend: `sbatch [options] SCRIPT [ARGS...]`.

The options are those of the #SBATCH lines the templates write, plus
--parsable and --dependency=afterany|afterok|afternotok:ID[:ID]; the command
line overrides the script's directives. Run from inside a job, the new job
gets the caller's environment without its SLURM_* variables, and starts in
the current directory, as a continuation job does on Slurm.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from clusterctl.backends.local.batchopts import OPTIONS, SHORT, OptionError, split_options
from clusterctl.backends.local.records import SubmitError, submit


def err(message: str) -> None:
    print(message, file=sys.stderr)


def split_argv(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """(options, script, script arguments): options end at the first word that is not one."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        i += 1
        if arg.startswith("--"):
            name, eq, _ = arg[2:].partition("=")
            if not eq and OPTIONS.get(name, ("", "no"))[1] == "yes":
                i += 1
        elif len(arg) == 2 and arg[1] in SHORT and OPTIONS[SHORT[arg[1]]][1] == "yes":
            i += 1
    options = argv[:i]
    if options and options[-1] == "--":
        options = options[:-1]
    script = argv[i] if i < len(argv) else None
    return options, script, argv[i + 1:]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    options, script, script_args = split_argv(args)
    try:
        parsable = any(name == "parsable" for name, _ in split_options(options, "on the command line"))
    except OptionError as exc:
        err(f"sbatch: error: {exc}")
        return 255
    if script is None:
        err("sbatch: error: a batch script file is required (reading the script from stdin is not emulated)")
        return 1
    if not os.access(script, os.R_OK) or not Path(script).is_file():
        err(f"sbatch: error: Unable to open file {script}")
        return 1
    try:
        job_id = submit(Path(script), Path.cwd(), options=options, script_args=script_args,
                        env=os.environ, python=sys.executable)
    except SubmitError as exc:
        err(f"sbatch: error: Batch job submission failed: {exc}")
        return 1
    print(job_id if parsable else f"Submitted batch job {job_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
