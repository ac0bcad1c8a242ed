"""The run directory: its layout and the records in it, standard library only (both sides read them).

    layout       names and paths: the one place that spells them (RunDir)
    jsonio       JSON files written so that readers never see half a write
    jobid        job ids as recorded (the scheduler's) and as shown (`local-N`)
    history      attempts.jsonl (+ state.json, cancel.json): the run's one history fold
    runjson      run.json: the static plan, typed
    attemptjson  attempt-N/attempt.json: one launch of all ranks
    verdict      attempt-N/verdict.json: the verdict, and its one writer
    timeline     attempt-N/timeline.jsonl: what the controller learned, per record kind
    phasetimes   attempt-N/phase-times.json: its measured saves and load, the next attempts' bounds
    metrics      attempt-N/metrics.jsonl: rank 0's per-step records
    rankmanifest attempt-N/manifest.json: every rank's registration
    suspects     nodes recent verdicts blamed, kept in the runs root
"""

from clusterctl.rundir.jsonio import read_json as read_json
from clusterctl.rundir.jsonio import write_json_atomic as write_json_atomic
from clusterctl.rundir.layout import *  # noqa: F403 - the layout's names are the package's: rundir.VERDICT, rundir.RunDir
