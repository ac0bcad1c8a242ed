"""submitit's `clusterctl` executor: a pickled Python function run as a clusterctl job.

    executor = submitit.AutoExecutor(folder, cluster="clusterctl")    # one rank on the local site
    executor = ClusterctlExecutor(folder, spec="job.yaml")            # the spec's site, nodes, checks
    executor.update_parameters(timeout_min=30, nodes=2, tasks_per_node=1)
    job = executor.submit(fn, *args)
    job.results()                                                     # one value per rank

The function becomes the spec's command (every rank runs
clusterctl.integrations.submitit.run), so it gets the same plan, binding,
rendezvous, watchdog and run directory as a training script. Runs go under
the executor's folder unless the spec names a runs_root. The Job answers from
clusterctl's state derivation (runstate.derive), not from sacct: the run
directory plus at most one scheduler query, so a job on a cluster without
slurmdbd, or one continued in a new job, still ends.
"""

from __future__ import annotations

import json
import threading
import time
import typing as tp
import warnings
from pathlib import Path

import yaml
from submitit.core import core, utils

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.integrations.submitit.paths import RunPaths, write_atomic

if tp.TYPE_CHECKING:
    from clusterctl.backends import Backend
    from clusterctl.plan.job import PlannedJob as ClusterJob
    from clusterctl.views.state import RunState

R = tp.TypeVar("R", covariant=True)

COMMAND = ["python", "-m", "clusterctl.integrations.submitit.run"]
DEFAULT_TIMEOUT_MIN = 5  # submitit's own default
DEFAULT_SPEC_FILE = "clusterctl-default.yaml"
DEFAULT_SPEC: dict[str, tp.Any] = {
    "name": "submitit",
    "site": "local",
    "time_limit": DEFAULT_TIMEOUT_MIN,
    "nodes": 1,
    "gpus_per_node": 1,
}
GENERIC = ("name", "timeout_min", "mem_gb", "nodes", "cpus_per_task", "gpus_per_node", "tasks_per_node", "stderr_to_stdout")
OWN = ("overrides", "restart_budget")  # names no other executor uses, so AutoExecutor routes them here only
ALIASES = {"slurm_partition": "partition", "slurm_account": "account", "partition": "partition", "account": "account"}
IGNORED = {
    "mem_gb": "the site's node type decides each rank's memory (one rank per GPU)",
    "cpus_per_task": "the site's rail map binds each rank to its GPU's CPUs",
    "stderr_to_stdout": "srun writes both streams of every rank to its node's log",
}
POLL_S = 1.0  # one state derivation per run per second, however many Job objects ask


def spec_overrides(parameters: dict[str, tp.Any], *, default_timeout: bool) -> list[str]:
    """submitit's parameters as `--set` overrides of the spec (the user's own `overrides` come last and win)."""
    sets: list[str] = []

    def put(field: str, value: tp.Any) -> None:
        sets.append(f"{field}={json.dumps(value)}")

    if "name" in parameters:
        put("name", parameters["name"])
    timeout = parameters.get("timeout_min", DEFAULT_TIMEOUT_MIN if default_timeout else None)
    if timeout is not None:
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1:
            raise ClusterctlError(f"timeout_min: got {timeout!r}; expected a whole number of minutes, at least 1", ExitCode.BAD_CONFIG)
        put("time_limit", timeout)  # bare numbers are minutes, as in sbatch
    if "nodes" in parameters:
        put("nodes", parameters["nodes"])
    per_node = {k: parameters[k] for k in ("tasks_per_node", "gpus_per_node") if k in parameters}
    if len(set(per_node.values())) > 1:
        raise ClusterctlError(
            f"tasks_per_node={per_node['tasks_per_node']} and gpus_per_node={per_node['gpus_per_node']}: clusterctl runs"
            " one rank per GPU, so give one of them (or both equal)",
            ExitCode.BAD_CONFIG,
        )
    if per_node:
        put("gpus_per_node", next(iter(per_node.values())))
    for name, field in ALIASES.items():
        if name in parameters:
            put(field, parameters[name])
    if "restart_budget" in parameters:
        put("restart.budget", parameters["restart_budget"])
    extra = parameters.get("overrides") or []
    if isinstance(extra, str) or not all(isinstance(item, str) and "=" in item for item in extra):
        raise ClusterctlError(f"overrides: got {extra!r}; expected a list of FIELD=VALUE strings, as --set takes", ExitCode.BAD_CONFIG)
    return sets + list(extra)


def submitit_state(state: str) -> str:
    """clusterctl's run state in submitit's (Slurm's) words."""
    from clusterctl.views import state as runstate

    return {
        runstate.PENDING: "PENDING",
        runstate.STARTING: "RUNNING",
        runstate.TRAINING: "RUNNING",
        runstate.RESTARTING: "RUNNING",
        runstate.STOPPING: "RUNNING",
        runstate.CONTINUED: "REQUEUED",
        runstate.COMPLETED: "COMPLETED",
        runstate.FAILED: "FAILED",
        runstate.CANCELLED: "CANCELLED",
    }.get(state, "UNKNOWN")


def derive_run(run_dir: Path) -> RunState:
    """The run's state as `clusterctl status` derives it: the run directory and one question about one job."""
    from clusterctl.backends import get_backend
    from clusterctl.rundir import RunDir
    from clusterctl.views.state import derive_one

    return derive_one(RunDir(run_dir), get_backend)  # a scheduler that cannot be asked: the run directory decides


def _sets_budget(spec: Path) -> bool:
    """Whether the spec file itself says restart.budget (then it is the user's choice, kept)."""
    from clusterctl.config.yamlload import load_yaml

    data = load_yaml(spec, "job spec").data
    restart = data.get("restart") if isinstance(data, dict) else None
    return isinstance(restart, dict) and "budget" in restart


class RunWatcher:
    """Caches each run's derived state for a second; a final state for good."""

    def __init__(self, every_s: float = POLL_S) -> None:
        self.every_s = every_s
        self._seen: dict[Path, tuple[float, RunState]] = {}
        self._lock = threading.Lock()

    def state(self, run_dir: Path, force: bool = False) -> RunState:
        from clusterctl.views.state import FINAL

        with self._lock:
            hit = self._seen.get(run_dir)
            if hit is not None and (hit[1].state in FINAL or (not force and time.monotonic() - hit[0] < self.every_s)):
                return hit[1]
            found = derive_run(run_dir)
            self._seen[run_dir] = (time.monotonic(), found)
            return found

    def forget(self, run_dir: Path) -> None:
        with self._lock:
            self._seen.pop(run_dir, None)


class ClusterctlJob(core.Job[R]):
    """A submitted function's run; one sub-job per rank (`job.task(rank)`), as submitit's multi-task jobs.

    `folder` is the run directory; `job_id` is the first job's id as clusterctl shows it.
    """

    watcher: tp.ClassVar[RunWatcher] = RunWatcher()  # type: ignore[assignment]
    _results_timeout_s = 5  # a shared filesystem may show a rank's result a moment after the run has ended

    def __init__(self, folder: Path | str, job_id: str, tasks: tp.Sequence[int] = (0,)) -> None:
        super().__init__(folder, job_id, tasks)
        self._run_dir = Path(folder).expanduser().absolute()
        self._paths = RunPaths(self._run_dir, self.task_id or 0)

    def _register_in_watcher(self) -> None:
        """Nothing to register: the watcher derives each run's state on demand."""

    @property
    def run_dir(self) -> Path:
        return self._run_dir

    def run_state(self, force: bool = False) -> RunState:
        """clusterctl's own view of the run (what `clusterctl status RUN --json` shows)."""
        return self.watcher.state(self._run_dir, force)

    @property
    def state(self) -> str:
        return submitit_state(self.run_state().state)

    def get_info(self, mode: str = "force") -> dict[str, str]:
        st = self.run_state(force=mode == "force")
        return {
            "State": submitit_state(st.state),
            "RunState": st.state,
            "Reason": st.reason,
            "JobID": st.job_id or "",
            "ExitCode": "" if st.exit_code is None else str(st.exit_code),
            "Run": str(self._run_dir),
        }

    def done(self, force_check: bool = False) -> bool:
        """Whether the run has ended (completed, failed, cancelled), through restarts and continuation jobs."""
        from clusterctl.views.state import FINAL

        return self.run_state(force_check).state in FINAL

    def cancel(self, check: bool = True) -> None:
        """Stop the whole run, as `clusterctl cancel RUN`: its job, any continuation, every restart.

        A run that has ended is left as it is (a cancel would mark a completed run cancelled).
        """
        from clusterctl.actions.cancel import cancel_run
        from clusterctl.rundir import RunDir

        if self.done(force_check=True):
            return
        try:
            cancel_run(RunDir(self._run_dir), save=False, timeout=60.0, show=lambda _line: None, by="submitit Job.cancel()")
        except ClusterctlError:
            if check:
                raise
        finally:
            self.watcher.forget(self._run_dir)

    def exception(self) -> utils.UncompletedJobError | utils.FailedJobError | None:
        """The first rank's exception with a traceback, else the first rank that left no result."""
        if not self._sub_jobs:
            return super().exception()
        found = [e for e in (sub.exception() for sub in self._sub_jobs) if e is not None]
        failed = [e for e in found if isinstance(e, utils.FailedJobError)]
        return (failed or found or [None])[0]

    def results(self) -> list[R]:
        if self._sub_jobs:
            error = self.exception()
            if error is not None:
                raise error
        return super().results()

    def _get_outcome_and_result(self) -> tuple[str, tp.Any]:
        path = self.paths.result_pickle
        deadline = time.monotonic() + self._results_timeout_s
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not path.exists():
            st = self.run_state(force=True)
            message = f"job {self.job_id} (rank {self.task_id}) left no result: run {self._run_dir.name} is {st.state}"
            message += f": {st.reason}" if st.reason else ""
            log = self.stderr()
            if log:
                message += "\nits last lines:\n" + "\n".join(log.splitlines()[-20:])
            raise utils.UncompletedJobError(message)
        return tp.cast(tuple[str, tp.Any], utils.pickle_load(path))

    def _get_logs_string(self, name: str) -> str | None:
        """This rank's lines from every attempt's node log (srun labels each with the rank); both streams."""
        from clusterctl import rundir
        from clusterctl.rundir import runjson
        from clusterctl.views.logs import list_attempts, parse_label

        run = rundir.RunDir(self._run_dir)
        gpn = (runjson.read(run.path) or runjson.RunJson()).gpus_per_node or 1
        rank = self.task_id or 0
        lines: list[str] = []
        for attempt in list_attempts(run):
            path = rundir.node_log(run.attempt(attempt.number), rank // gpn)
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            lines += [body for owner, body in map(parse_label, text.splitlines()) if owner == rank]
        return "\n".join(lines) if lines else None

    def __del__(self) -> None:
        if getattr(self, "_cancel_at_deletion", False) and not self.done():
            self.cancel(check=False)


class ClusterctlExecutor(core.PicklingExecutor):
    """Submits functions as clusterctl runs; `spec` (a job.yaml) chooses site, nodes and the rest.

    Without a spec a function runs as one rank on the `local` site (this
    machine), with submitit's 5-minute default limit. submitit's parameters
    map onto the spec (timeout_min -> time_limit, whose pre-timeout lead the
    spec scales: a tenth of it, at most 300 s; nodes; tasks_per_node or gpus_per_node -> gpus_per_node,
    one rank per GPU; name), as do `slurm_partition`/`slurm_account`,
    `restart_budget` and `overrides` (a list of FIELD=VALUE, as `--set`).
    A function that raises is not called again, as with submitit:
    restart.budget is 0 unless the spec file or `restart_budget` says otherwise.
    """

    job_class = ClusterctlJob

    def __init__(
        self,
        folder: Path | str,
        spec: Path | str | None = None,
        overrides: list[str] | None = None,
        backend: str | None = None,
        max_num_timeout: int = 3,
        max_pickle_size_gb: float = 1.0,
    ) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout, max_pickle_size_gb=max_pickle_size_gb)
        self.spec = Path(spec).expanduser().absolute() if spec is not None else None
        if self.spec is not None and not self.spec.is_file():
            raise ClusterctlError(f"spec {self.spec}: no such file", ExitCode.BAD_CONFIG)
        self.backend = backend
        if overrides:
            self.update_parameters(overrides=list(overrides))

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return set(OWN)

    @classmethod
    def affinity(cls) -> int:
        """0: used when asked for by name (cluster="clusterctl"), never chosen by AutoExecutor on its own."""
        return 0

    def _internal_update_parameters(self, **kwargs: tp.Any) -> None:
        known = set(GENERIC) | set(OWN) | set(ALIASES)
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ClusterctlError(
                f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for the clusterctl executor;"
                f" expected some of {', '.join(sorted(known))} (any spec field through overrides=['FIELD=VALUE'])",
                ExitCode.USAGE,
            )
        for name in sorted(set(kwargs) & set(IGNORED)):
            if kwargs[name] is not None:
                warnings.warn(f"{name} is ignored by the clusterctl executor: {IGNORED[name]}", stacklevel=3)
        super()._internal_update_parameters(**kwargs)

    def _spec_path(self) -> Path:
        if self.spec is not None:
            return self.spec
        path = self.folder / DEFAULT_SPEC_FILE
        text = yaml.safe_dump(DEFAULT_SPEC, sort_keys=False)
        if not path.is_file() or path.read_text() != text:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode())
        return path

    def load_job(self) -> ClusterJob:
        """The clusterctl job a submission makes: the spec, the parameters, this folder as runs root, our command."""
        from clusterctl.actions.submit import local_suspects
        from clusterctl.plan.job import plan_job, read_job

        path = self._spec_path()
        sets = spec_overrides(self.parameters, default_timeout=self.spec is None)
        if "restart_budget" not in self.parameters and not _sets_budget(path):
            # submitit never calls a function again after it raised; a fault restart would.
            sets = ["restart.budget=0", *sets]
        command = [f"command={json.dumps(COMMAND)}"]
        config = read_job(path, sets + command)
        if config.spec.runs_root is None:
            config = read_job(path, [f"runs_root={json.dumps(str(self.folder))}", *sets, *command])
        return plan_job(config, local_suspects(config))  # planned once, as `clusterctl submit` plans

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[core.Job[tp.Any]]:
        from clusterctl.actions.submit import default_backend
        from clusterctl.backends import get_backend

        job = self.load_job()  # a refused spec submits nothing
        backend = get_backend(self.backend or default_backend(job))
        backend.check()
        timeout_min = max(1, job.spec.time_limit // 60)
        jobs: list[core.Job[tp.Any]] = []
        for delayed in delayed_submissions:
            delayed.set_timeout(timeout_min, self.max_num_timeout)
            jobs.append(self._submit_one(job, backend, delayed))
        return jobs

    def _submit_one(self, job: ClusterJob, backend: Backend, delayed: utils.DelayedSubmission) -> ClusterctlJob[tp.Any]:
        """Create the run, put the pickle in it, then hand its batch script to the scheduler."""
        import cloudpickle

        from clusterctl.actions.submit import submit_job, submit_rendered

        blob = cloudpickle.dumps(delayed)
        if len(blob) > self.max_pickle_size_gb * 1024**3:
            raise ClusterctlError(
                f"the function and its arguments pickle to {len(blob) / 1024**3:.2f} GB, over max_pickle_size_gb ="
                f" {self.max_pickle_size_gb}: pass paths to the data instead, or raise the limit",
                ExitCode.USAGE,
            )
        run = submit_job(job, backend.name, dry_run=True).run  # the run directory, complete, not yet submitted
        paths = RunPaths(run.path)
        paths.folder.mkdir()
        write_atomic(paths.submitted_pickle, blob)
        done = submit_rendered(run, backend, Path.cwd())
        for warning in done.warnings:
            warnings.warn(warning, stacklevel=4)
        return ClusterctlJob(run.path, done.display_id or done.job_id or run.path.name, tasks=list(range(job.plan.world_size)))

    # PicklingExecutor's own sbatch path is not used: submit_job renders and submits.
    def _num_tasks(self) -> int:
        return int(self.parameters.get("nodes", 1)) * int(self.parameters.get("tasks_per_node", self.parameters.get("gpus_per_node", 1)))

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        raise NotImplementedError("the clusterctl executor renders its batch script with clusterctl")

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        raise NotImplementedError("the clusterctl executor submits with clusterctl")

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        raise NotImplementedError("the clusterctl executor submits with clusterctl")
