"""Render a plan into the files of a run: job.sbatch, wrapper.sh, run.json.

Pure: takes a Plan and where the run directory will be, returns file
contents. Every value that reaches shell goes through the `sh` filter
(shlex.quote) or is one of the validated shapes (numbers, job name, node
names); jinja2 runs with StrictUndefined so a typo in a template fails the
render instead of producing an empty string.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jinja2

from clusterctl import envnames, rundir
from clusterctl.config.shipped import shipped_dir
from clusterctl.errors import ConfigError, Problem
from clusterctl.exitcodes import PASSTHROUGH, ExitCode
from clusterctl.plan import Plan
from clusterctl.plan.binding import VISIBILITY_VAR, binding_table
from clusterctl.render.container import ContainerPlan, apptainer_flags, pyxis_flags, rank_env_names, task_vars
from clusterctl.render.container import resolve as resolve_container
from clusterctl.rundir import attemptjson, secretenv
from clusterctl.rundir.access import GROUP, Access
from clusterctl.rundir.runjson import (
    BatchRecord,
    CheckpointRecord,
    ElasticRecord,
    NodeTypeRecord,
    Parallel,
    PreflightRecord,
    RendezvousRecord,
    RestartRecord,
    RunJson,
    SignalRecord,
    WatchdogRecord,
    WidthRecord,
)
from clusterctl.syntax import hostlist
from clusterctl.syntax.ports import FNV_OFFSET, FNV_PRIME
from clusterctl.syntax.slurmrelease import TASK_SHARING
from clusterctl.syntax.units import format_slurm_time

SBATCH_TEMPLATE = "job.sbatch.j2"
WRAPPER_TEMPLATE = "wrapper.sh.j2"
# #SBATCH lines are not shell: sbatch reads them itself, so paths there must be plain.
SBATCH_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+@:=,-]*$")
VERDICT_GRACE_S = 15  # srun may outlive a verdict this long (tasks on a lost node) before the batch script stops it


def single_quote(value: object) -> str:
    """Always single-quoted (shlex.quote leaves plain words bare, which shellcheck flags in arrays)."""
    return "'" + str(value).replace("'", "'\\''") + "'"


@dataclass(frozen=True)
class Rendered:
    files: dict[str, str]  # file name in the run directory -> content
    run_json: RunJson


def template_env(site_templates: Path | None) -> jinja2.Environment:
    """Site templates first (they may override any file), then the shipped ones."""
    dirs = [str(site_templates)] if site_templates else []
    dirs.append(str(shipped_dir("templates")))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(dirs),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        # bash's ${#array[@]} would open a jinja comment with the default "{#".
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters["sh"] = lambda value: shlex.quote(str(value))
    env.filters["sq"] = single_quote
    return env


def site_templates_dir(plan: Plan, site_path: Path | None) -> Path | None:
    """The site's `templates:` directory, relative to the site file."""
    if not plan.site.templates:
        return None
    path = Path(plan.site.templates).expanduser()
    if not path.is_absolute() and site_path is not None:
        path = site_path.parent / path
    return path


def owned_dirs(run_dir: Path, checkpoints: Path | None) -> list[str]:
    """What the batch script checks is the user's alone before it reads anything (rundir/ownership.py): the runs
    root, the run, and a checkpoint directory outside the run."""
    outside = checkpoints is not None and run_dir not in checkpoints.parents and checkpoints != run_dir
    return [str(run_dir.parent), str(run_dir), *([str(checkpoints)] if outside else [])]


def controller_argv(python: str, standalone: bool, warm: bool = False) -> list[str]:
    """The batch script's controller command (none in standalone mode: rank 0 hosts the store); forked warm where it can be."""
    if standalone:
        return []
    client = [python, "-m", "clusterctl.runtime.node.warm.client", "--"] if warm else []
    return [*client, python, "-m", "clusterctl.runtime.controller"]


def aggregator_argv(python: str, standalone: bool) -> list[str]:
    """The node aggregators' command (none in standalone mode: no controller takes their batches)."""
    return [] if standalone else [python, "-m", "clusterctl.runtime.node.aggregator"]


def recovery_argv(python: str, standalone: bool) -> list[str]:
    """The batch script's recovery step (none in standalone mode: each job runs one attempt)."""
    return [] if standalone else [python, "-m", "clusterctl.runtime.recovery.nextattempt"]


def warm_argv(plan: Plan, python: str, standalone: bool, containerized: bool, run_dir: Path) -> list[str]:
    """The warm process servers' command, none when the job runs cold.

    Cold where the spec says so, in standalone mode (no clusterctl on the
    nodes), and in a container: the ranks run inside the image, the batch
    script outside it, and no server runs in the image yet.
    """
    if standalone or containerized or not plan.spec.restart.warm:
        return []
    argv = [python, "-m", "clusterctl.runtime.node.warm.server", "--run-dir", str(run_dir)]
    for module in plan.spec.restart.preimport:
        argv += ["--import", module]
    return argv


def launcher_argv(plan: Plan, python: str, standalone: bool) -> list[str]:
    """What the wrapper execs: the user's command, through clusterctl.launch unless standalone."""
    command = list(plan.spec.command or [])
    if standalone:
        return command
    return [python, "-m", "clusterctl.launch", "--", *command]


@dataclass(frozen=True)
class _Parts:
    """What the batch script, the wrapper and run.json are rendered from, decided once."""

    access: Access
    container: ContainerPlan | None
    table: list[Any]  # the node type's binding table, a row a GPU
    cpus_per_task: int
    port_range: Any
    srun_extra: list[str]
    site_env: dict[str, str]
    warm: list[str]
    checkpoints: Path | None


def render_run(
    plan: Plan,
    run_dir: Path,
    *,
    python: str,
    standalone: bool = False,
    site_path: Path | None = None,
    run_id: str | None = None,
    groups_here: bool = True,
) -> Rendered:
    """Render the batch script, wrapper and run.json for a run directory at `run_dir`."""
    parts = _parts(plan, run_dir, python, standalone, run_id, groups_here)
    spec, container = plan.spec, parts.container
    common = _common(plan)
    argv = launcher_argv(plan, container.python if container else python, standalone)
    sbatch_ctx = _sbatch_context(plan, run_dir, python, standalone, parts, common)
    wrapper_ctx = _wrapper_context(plan, run_dir, parts, common, argv)
    table, port_range, warm, access = parts.table, parts.port_range, parts.warm, parts.access
    env = template_env(site_templates_dir(plan, site_path))
    try:
        sbatch = env.get_template(SBATCH_TEMPLATE).render(sbatch_ctx)
        wrapper = env.get_template(WRAPPER_TEMPLATE).render(wrapper_ctx)
    except jinja2.TemplateError as exc:
        where = getattr(exc, "filename", None) or getattr(exc, "name", None) or "template"
        raise ConfigError("templates", [Problem("templates", str(where), f"expected a template that renders ({exc})")]) from None
    run_json = build_run_json(plan, run_id, table, argv, port_range, standalone)
    run_json = replace(run_json, restart=replace(run_json.restart, warm=bool(warm)),
                       runs_mode=access.mode, runs_group=access.group, secret_env=tuple(spec.secret_env),
                       container=container.runtime if container else "")
    return Rendered(
        files={
            rundir.SBATCH: sbatch,
            rundir.WRAPPER: wrapper,
            rundir.RUN_JSON: run_json.to_json(),
        },
        run_json=run_json,
    )


def _parts(plan: Plan, run_dir: Path, python: str, standalone: bool, run_id: str | None, groups_here: bool) -> _Parts:
    """The decisions the three files share, after the checks only a run's place can make (ConfigError)."""
    spec, site, node_type = plan.spec, plan.site, plan.node_type
    problems = []
    if not spec.command:
        problems.append(Problem("command", None, "expected the command each rank runs (an argv list or a string)"))
    if not SBATCH_SAFE_PATH.match(str(run_dir)):
        problems.append(
            Problem(
                "runs_root",
                str(run_dir),
                "expected an absolute path of letters, digits and . _ / + @ : = , - (sbatch reads it unquoted)",
            )
        )
    access = run_access(plan, problems, groups_here)
    checkpoints = Path(spec.checkpoint.dir) if spec.checkpoint.dir else None
    container, container_problems = resolve_container(spec, site, run_dir, checkpoints, f"clusterctl-{run_id or spec.name}")
    problems += container_problems
    if problems:
        raise ConfigError("job spec", problems)

    table = binding_table(node_type)
    gpn = plan.gpus_per_node
    cpus_per_task = 1 if site.oversubscribe else max(1, min(row.ncpus for row in table[:gpn]))
    port_range = spec.rendezvous.port_range or site.network.port_range
    srun_extra = []
    if site.gres != "none" and node_type.gpu_vendor == "nvidia" and site.slurm_has(TASK_SHARING, unknown=False):
        srun_extra.append("--gres-flags=allow-task-sharing")  # each rank bound to its GPU keeps peer access to the others
    if container is not None and container.runtime == "pyxis":
        srun_extra += pyxis_flags(container, VISIBILITY_VAR[node_type.gpu_vendor])
    site_env = job_site_env(plan)
    warm = warm_argv(plan, python, standalone, container is not None, run_dir)
    return _Parts(access, container, table, cpus_per_task, port_range, srun_extra, site_env, warm, checkpoints)


def _common(plan: Plan) -> dict[str, Any]:
    """What both templates read: the job's sizes, the exit codes, the environment variables' names."""
    spec, gpn = plan.spec, plan.gpus_per_node
    return {
        "name": spec.name,
        "world": plan.world_size,
        "nodes": plan.nodes,
        "spares": spec.spares,
        "gpus_per_node": gpn,
        "exit": {c.name: int(c) for c in ExitCode},
        "env": {k: getattr(envnames, k) for k in dir(envnames) if k.isupper() and isinstance(getattr(envnames, k), str)},
    }


def _sbatch_context(plan: Plan, run_dir: Path, python: str, standalone: bool, parts: _Parts,
                    common: dict[str, Any]) -> dict[str, Any]:
    """job.sbatch.j2's context: the allocation's directives, the rendezvous, the processes it starts, the files."""
    spec, site = plan.spec, plan.site
    container, warm, site_env, access, checkpoints = parts.container, parts.warm, parts.site_env, parts.access, parts.checkpoints
    cpus_per_task, port_range, srun_extra = parts.cpus_per_task, parts.port_range, parts.srun_extra
    return {
        **common,
        "partition": plan.partition,
        "account": spec.account,
        "nodes_alloc": plan.nodes_allocated,
        "gres": site.gres,
        "cpus_per_task": cpus_per_task,
        "exclusive": "topo" if spec.topology.exclusive_topo else ("node" if not site.oversubscribe else ""),
        "oversubscribe": site.oversubscribe,
        "time": format_slurm_time(spec.time_limit),
        "switches": spec.topology.switches,
        "switch_wait": format_slurm_time(spec.topology.switch_wait) if spec.topology.switch_wait else None,
        "segment": plan.segments.sbatch_size if plan.segments and plan.segments.rendered else None,
        "constraint": "&".join(spec.topology.features) or None,
        "exclude": ",".join(spec.topology.exclude) or None,
        "signal": spec.signal.name,
        "signal_lead": spec.lead_s,
        "batch_log": f"{run_dir}/{rundir.BATCH_LOG.format(job='%j')}",
        "umask": f"{access.umask:04o}",
        "secrets_file": str(run_dir / secretenv.FILE),
        "owned_dirs": owned_dirs(run_dir, checkpoints),
        "run_dir": str(run_dir),
        "wrapper": str(run_dir / rundir.WRAPPER),
        "port_range": port_range,
        "interface": spec.rendezvous.interface or site.network.interface or "",
        "address_family": site.network.address_family,
        "addresses": sorted(site.network.addresses.items()),
        "modules": [*site.modules, *spec.modules],
        "site_env": sorted(site_env.items()),
        "container": container.runtime if container else "",
        "container_mounts": ",".join(container.binds) if container else "",
        "rank_env": str(run_dir / rundir.RANK_ENV),
        "rank_env_names": rank_env_names(list(site_env), list(spec.secret_env)),
        "srun_extra": srun_extra,
        "controller_argv": controller_argv(python, standalone, bool(warm)),
        "warm_argv": warm,
        "warm_log": rundir.WARM_LOG.format(job="${SLURM_JOB_ID}"),
        "job_env": sorted(spec.env.items()),
        "aggregator_argv": aggregator_argv(python, standalone),
        "recovery_argv": recovery_argv(python, standalone),
        "srun_log": rundir.SRUN_LOG,
        "verdict_json": rundir.VERDICT,
        "verdict_grace_s": VERDICT_GRACE_S,
        "passthrough_codes": sorted(int(c) for c in PASSTHROUGH),
        "fnv_offset": FNV_OFFSET,
        "fnv_prime": FNV_PRIME,
        "attempts_file": rundir.ATTEMPTS,
        "attempt_prefix": rundir.ATTEMPT_PREFIX,
        "attempt_json": rundir.ATTEMPT_JSON,
        "attempt_json_format": attemptjson.FORMAT,
        "hosts_file": rundir.HOSTS,
        "controller_json": rundir.CONTROLLER_JSON,
        "token_file": rundir.TOKEN_FILE,
        "logs_dir": rundir.LOGS,
        "node_log": rundir.NODE_LOG.format(slot="%n"),  # srun's %n: the node's index in the step (its slot)
        "aggregator_log": rundir.AGGREGATOR_LOG.format(slot="%n"),
        "aggregator_srun_log": rundir.AGGREGATOR_SRUN_LOG,
    }


def _wrapper_context(plan: Plan, run_dir: Path, parts: _Parts, common: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """wrapper.sh.j2's context: the rank's binding table, its coordinates, its command, its container."""
    spec, node_type, layout = plan.spec, plan.node_type, plan.dims.layout
    container, table = parts.container, parts.table
    return {
        **common,
        "node_type": plan.node_type_name,
        "table": table,
        "visibility_var": VISIBILITY_VAR[node_type.gpu_vendor],
        "tp": layout.tp,
        "cp": layout.cp,
        "pp": layout.pp,
        "ep": layout.ep,
        "coord": {axis: envnames.coord_var(axis) for axis in envnames.COORDS},
        "job_env": sorted(spec.env.items()),
        "argv": argv,
        "container": container.runtime if container else "",
        "container_env": sorted(container.env.items()) if container else [],
        "apptainer": [container.apptainer, "exec", *apptainer_flags(container, node_type.gpu_vendor)] if container else [],
        "image": container.image if container else "",
        "package_dir": container.package_dir if container else "",
        "task_vars": task_vars(VISIBILITY_VAR[node_type.gpu_vendor]),
        "rank_env": str(run_dir / rundir.RANK_ENV),
        "restart_budget": spec.restart.budget,
    }


def spec_hash(spec: Any) -> str:
    """A short hash of the resolved spec: a checkpoint records which job wrote it."""
    text = json.dumps(spec.model_dump(mode="json", by_alias=True), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_access(plan: Plan, problems: list[Problem], groups_here: bool = True) -> Access:
    """Who may read the run (the spec's runs_mode and runs_group, else the site's); a problem when group sharing
    names no group, or (`groups_here`: the run is made on this machine) one this machine does not know. A run
    rendered here for another machine (`submit --remote`) has its group checked there, by `submit-run`."""
    spec, site = plan.spec, plan.site
    access = Access(spec.runs_mode or site.runs_mode, spec.runs_group or site.runs_group)
    field = "runs_group" if spec.runs_group or spec.runs_mode else "site runs_group"
    if access.mode == GROUP:
        if not access.group:
            problems.append(Problem(field, None, "expected the group that `runs_mode: group` shares the run with"))
        elif groups_here:
            try:
                access.gid()
            except KeyError:
                problems.append(Problem(field, access.group, "expected a group this machine knows (getent group NAME)"))
    return access if access.mode == GROUP else Access()


def build_run_json(
    plan: Plan,
    run_id: str | None,
    table: list[Any],
    argv: list[str],
    port_range: tuple[int, int],
    standalone: bool,
) -> RunJson:
    """The static plan: sizes and formulas, never per-rank lists, so it stays small at any scale."""
    spec, layout, site = plan.spec, plan.dims.layout, plan.site
    return RunJson(
        run_id=run_id,
        name=spec.name,
        site=site.name,
        partition=plan.partition,
        mode="standalone" if standalone else "managed",
        world_size=plan.world_size,
        nodes=plan.nodes,
        spares=spec.spares,
        exclude=tuple(node for expr in spec.topology.exclude for node in hostlist.expand(expr)),
        segment_nodes=plan.segments.size if plan.segments else 0,
        segment_spares=plan.segments.spares_each if plan.segments else 0,
        domains=_partition_blocks(plan) if plan.segments else {},
        nvlink_kinds=tuple(plan.segments.spans) if plan.segments else (),
        gpus_per_node=plan.gpus_per_node,
        parallel=Parallel(tp=layout.tp, cp=layout.cp, ep=layout.ep, dp=layout.dp, pp=layout.pp, vpp=plan.dims.vpp),
        node_type=NodeTypeRecord(
            name=plan.node_type_name,
            gpu_model=plan.node_type.gpu_model,
            gpu_vendor=plan.node_type.gpu_vendor,
            visibility_var=VISIBILITY_VAR[plan.node_type.gpu_vendor],
            binding=tuple(row.as_dict() for row in table),
        ),
        batch=BatchRecord(micro=plan.batch.micro, grad_accum=plan.batch.grad_accum, global_=plan.batch.global_batch),
        elastic=_elastic_record(plan),
        seq_len=spec.seq_len,
        model=spec.model.model_dump(mode="json") if spec.model else None,
        precision=spec.precision.model_dump(mode="json"),
        spec_hash=spec_hash(spec),
        argv=tuple(argv),
        command=tuple(spec.command or []),
        env=dict(sorted(spec.env.items())),
        site_env=dict(sorted(job_site_env(plan).items())),
        rendezvous=RendezvousRecord(
            port_range=tuple(port_range),  # type: ignore[arg-type]
            interface=spec.rendezvous.interface or site.network.interface,
            address_family=site.network.address_family,
            timeout_s=spec.rendezvous.timeout,
        ),
        signal=SignalRecord(name=spec.signal.name, lead_s=spec.lead_s),
        time_limit_s=spec.time_limit,
        checkpoint=CheckpointRecord(
            dir=spec.checkpoint.dir,
            interval=spec.checkpoint.interval,
            keep=spec.checkpoint.keep,
            async_=spec.checkpoint.async_,
            save_seconds=spec.checkpoint.save_seconds,
            mtbf=spec.checkpoint.mtbf,
            auto_interval_s=plan.checkpoint.interval_s if plan.checkpoint else None,
            memory_interval=plan.memory_interval,
        ),
        restart=RestartRecord(budget=spec.restart.budget, mode=spec.restart.mode, in_allocation=spec.restart.in_allocation),
        watchdog=WatchdogRecord(
            hang_timeout=spec.watchdog.hang_timeout,
            straggler_factor=spec.watchdog.straggler_factor,
            straggler_min_compute_s=spec.watchdog.straggler_min_compute_s,
            straggler_min_lost_s=spec.watchdog.straggler_min_lost_s,
            window=spec.watchdog.window,
            save_timeout=spec.watchdog.save_timeout,
            load_timeout=spec.watchdog.load_timeout,
            steps=spec.watchdog.steps,
        ),
        preflight=PreflightRecord(checks=tuple(spec.preflight.checks), timeout=spec.preflight.timeout),
        exit_codes={c.name: int(c) for c in ExitCode},
    )


def _elastic_record(plan: Plan) -> ElasticRecord:
    """The widths an elastic job may shrink to, as the nodes read them (none: the job is not elastic)."""
    found = plan.elastic
    if found is None:
        return ElasticRecord()
    widths = tuple(WidthRecord(nodes=w.nodes, dp=w.dp, micro=w.micro, grad_accum=w.grad_accum, global_=w.global_batch)
                   for w in found.widths)
    return ElasticRecord(batch=found.batch, grow=found.grow, min_nodes=found.min_nodes, widths=widths)


def _partition_blocks(plan: Plan) -> dict[str, str]:
    """The blocks holding the partition's nodes, each as a hostlist of those nodes (small at any scale)."""
    part = plan.site.partitions[plan.partition].nodes
    members = set(hostlist.expand(part)) if part else None
    out = {}
    for block in plan.site.topology.blocks:
        nodes = [n for n in hostlist.expand(block.nodes) if members is None or n in members]
        if nodes:
            out[block.name] = hostlist.compress(nodes)
    return out


MNNVL_ENV = {"NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1"}
"""NCCL over multi-node NVLink: on (an unusable fabric then fails at the first collective instead of falling back to
the network unseen), with the cuMem allocations it needs."""


def job_site_env(plan: Plan) -> dict[str, Any]:
    """The site's environment for this job: the site's env, and the NCCL settings for multi-node NVLink when the
    job's groups span nodes over it (segments on an NVIDIA block site). The site's and the spec's values win."""
    env: dict[str, Any] = dict(plan.site.env)
    if plan.segments and plan.node_type.gpu_vendor == "nvidia":
        env = {**{k: v for k, v in MNNVL_ENV.items() if k not in plan.spec.env}, **env}
    return env
