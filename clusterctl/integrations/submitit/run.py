"""What every rank of a submitted function runs: `python -m clusterctl.integrations.submitit.run`.

It is the job's command, so clusterctl.launch runs it in the rank's own
process after preflight and the rendezvous: the function gets the same
binding, environment and watchdog as a training script. It loads the run's
submitted pickle (the callable, or the checkpoint a pre-timeout stop left),
calls it, and writes this rank's outcome where the submitting process's Job
reads it: ("success", value) or ("error", traceback). An exception is raised
again afterwards, so the controller's verdict names the rank and keeps the
traceback (verdict.json), as for any failing script.
"""

from __future__ import annotations

import os
import sys
import traceback

from clusterctl import envnames
from clusterctl.exitcodes import ExitCode


def main() -> int:
    run_dir = os.environ.get(envnames.RUN_DIR)
    if not run_dir:
        print(
            "clusterctl.integrations.submitit.run: not inside a clusterctl job (no CLUSTERCTL_RUN_DIR);"
            " submit functions with ClusterctlExecutor",
            file=sys.stderr,
        )
        return int(ExitCode.USAGE)
    from submitit.core.utils import DelayedSubmission

    from clusterctl.integrations.submitit.environment import ClusterctlJobEnvironment
    from clusterctl.integrations.submitit.paths import RunPaths
    from clusterctl.integrations.submitit.stop import StopWatch, peer_handler, rank0_handler, save_pickle
    from clusterctl.rundir import RunDir
    from clusterctl.runtime.rank import rendezvous

    rank = int(os.environ.get("RANK", "0") or 0)
    attempt = int(os.environ.get(envnames.ATTEMPT, "0") or 0)
    paths = RunPaths(run_dir, rank)
    os.environ["SUBMITIT_EXECUTOR"] = ClusterctlJobEnvironment.name()  # submitit.JobEnvironment() finds ours
    os.environ["SUBMITIT_FOLDER"] = str(paths.folder)
    delayed = DelayedSubmission.load(paths.submitted_pickle)
    paths.result_pickle.unlink(missing_ok=True)  # an earlier attempt's outcome is not this one's
    store = rendezvous.CURRENT_STORE
    on_stop = (
        rank0_handler(delayed, paths.submitted_pickle, RunDir(paths.run_dir), attempt, store)
        if rank == 0
        else peer_handler(store)
    )
    watch = StopWatch(on_stop, store)
    try:
        result = delayed.result()
    except Exception:
        watch.close()
        save_pickle(("error", traceback.format_exc()), paths.result_pickle)
        raise
    finally:
        watch.close()
    save_pickle(("success", result), paths.result_pickle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
