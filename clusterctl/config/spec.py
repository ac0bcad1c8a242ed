"""The job spec (`job.yaml`): model, loading, `--set` overrides.

Every field any part of clusterctl uses is declared here, so the schema is
complete from the start and a typo is an error, never silently ignored.
Cross-field rules that need the site (world size, NVLink domains) live in the
planner; rules that need only the spec live here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from clusterctl.config.fieldtypes import (
    ENV_DESCRIPTION,
    HOST_EXPR,
    JOB_NAME,
    MODULE_NAME,
    RUNS_MODE_DESCRIPTION,
    SLURM_WORD,
    EnvName,
    EnvValue,
    GroupName,
    NonNegativeInt,
    ParamCount,
    PlainPath,
    PositiveInt,
    RunsMode,
    ScriptText,
    Seconds,
    SlurmMinutes,
)
from clusterctl.config.problems import validate_located
from clusterctl.config.yamlload import Located, load_yaml
from clusterctl.errors import ConfigError, Problem
from clusterctl.syntax.shellwords import split_command
from clusterctl.syntax.units import format_duration

# --- field types: config/fieldtypes.py; the spec's own constants --------------

Dtype = Literal["fp32", "bf16", "fp16", "fp8"]
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "URG", "XCPU")
PREFLIGHT_CHECKS = ("gpu", "nic", "cpu", "memory", "dirs", "shared_fs", "comm", "compute")
DEFAULT_PREFLIGHT = ("gpu", "nic", "cpu", "memory", "dirs", "shared_fs")


class Section(BaseModel):
    """Base for every spec section: unknown keys are errors, values are frozen."""

    # Numbers given where text is expected (argv items, names) are taken as text.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


# --- sections ----------------------------------------------------------------


class Parallel(Section):
    """Parallel dimensions; dp is derived from the world size when omitted."""

    tp: PositiveInt = Field(1, description="tensor parallel size")
    pp: PositiveInt = Field(1, description="pipeline parallel size")
    dp: PositiveInt | None = Field(None, description="data parallel size (derived from nodes when omitted)")
    cp: PositiveInt = Field(1, description="context parallel size")
    ep: PositiveInt = Field(1, description="expert parallel size (must divide dp*cp)")
    vpp: PositiveInt = Field(1, description="virtual pipeline stages per pipeline rank (interleaved 1F1B)")


class Batch(Section):
    """Batch arithmetic: global = micro * grad_accum * dp; give any two of global/grad_accum."""

    micro: PositiveInt = Field(1, description="micro-batch size per data-parallel rank")
    global_: PositiveInt | None = Field(None, alias="global", description="global batch size (sequences per step)")
    grad_accum: PositiveInt | None = Field(None, description="micro-batches accumulated per step")


class ModelShape(Section):
    """Model size: either `params`, or the transformer shape (or both)."""

    params: ParamCount | None = Field(None, description="total parameter count (overrides the shape-derived count)")
    layers: PositiveInt | None = Field(None, description="transformer layers (divisible by parallel.pp, or pp*vpp)")
    hidden: PositiveInt | None = Field(None, description="hidden size (divisible by heads)")
    heads: PositiveInt | None = Field(None, description="attention heads (divisible by parallel.tp)")
    kv_heads: PositiveInt | None = Field(None, description="key/value heads (GQA); defaults to heads")
    ffn: PositiveInt | None = Field(None, description="MLP hidden size; defaults to 4*hidden")
    vocab: PositiveInt | None = Field(None, description="vocabulary size (the embedding and output layers' rows)")
    gated_mlp: bool = Field(True, description="SwiGLU-style MLP with three matrices")
    tied_embeddings: bool = Field(False, description="the output layer shares the input embedding's weights")
    experts: NonNegativeInt = Field(0, description="MoE experts per layer (0 = dense)")

    @model_validator(mode="after")
    def _shape_or_params(self) -> ModelShape:
        shape = {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "vocab": self.vocab}
        given = [k for k, v in shape.items() if v is not None]
        if self.params is None and len(given) < len(shape):
            missing = ", ".join(k for k in shape if shape[k] is None)
            raise ValueError(f"give either params, or the shape layers/hidden/heads/vocab (missing: {missing})")
        if self.hidden is not None and self.heads is not None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads is not None and self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        return self


class Precision(Section):
    """Compute dtype plus the storage dtypes that decide bytes per parameter."""

    compute: Dtype = Field("bf16", description="matmul dtype")
    params: Dtype | None = Field(None, description="model weights (default: compute, bf16 for fp8)")
    grads: Dtype | None = Field(None, description="gradients (default: params)")
    master: Literal["fp32", "bf16", "none"] | None = Field(
        None, description="master weights kept by the optimizer (default: fp32 unless params are fp32)"
    )
    optimizer: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="optimizer state dtype")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"compute": value} if isinstance(value, str) else value

    @property
    def params_dtype(self) -> str:
        if self.params is not None:
            return self.params
        return "bf16" if self.compute == "fp8" else self.compute

    @property
    def grads_dtype(self) -> str:
        return self.grads or self.params_dtype

    @property
    def master_dtype(self) -> str:
        if self.master is not None:
            return self.master
        return "none" if self.params_dtype == "fp32" else "fp32"


class Topology(Section):
    """Placement constraints for the allocation."""

    switches: PositiveInt | None = Field(None, description="at most this many leaf switches (sbatch --switches)")
    switch_wait: SlurmMinutes | None = Field(None, description="how long to wait for --switches")
    features: list[Annotated[str, Field(pattern=SLURM_WORD.pattern)]] = Field(
        default_factory=list, description="node features (letters, digits, . _ -), ANDed into --constraint"
    )
    exclude: list[Annotated[str, Field(pattern=HOST_EXPR.pattern)]] = Field(
        default_factory=list, description="node names or hostlist expressions (gpu-[001-004]) never to use"
    )
    avoid_suspects: bool = Field(
        True, description="also exclude nodes a recent verdict blamed (the site's reliability.suspect_hours); false keeps them"
    )
    avoid_drill_suspects: bool = Field(
        False, description="also exclude nodes blamed for a fault `clusterctl drill` injected (by default they are only listed)"
    )
    tp_in_nvlink: bool = Field(True, description="require each tensor-parallel group inside one NVLink domain")
    tp_cp_in_nvlink: bool = Field(False, description="also require each tp*cp group inside one NVLink domain")
    ep_in_nvlink: bool = Field(False, description="also require each expert-parallel group inside one NVLink domain")
    segment: PositiveInt | None = Field(
        None,
        description="nodes per segment on a block site (sbatch --segment: each segment in one block, an NVLink domain);"
        " default: the smallest multiple of an NVLink-bound group's nodes that divides the job's nodes and fits the"
        " site's segment_size",
    )
    exclusive_topo: bool = Field(
        False, description="sbatch --exclusive=topo: no other job in the blocks this one uses (Slurm 24.05 or later)"
    )


def _steps_or_auto(least: int, expected: str) -> Any:
    def check(value: Any) -> int | str:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= least):
            return value
        raise ValueError(expected)

    return check


_interval = _steps_or_auto(1, "expected a positive whole number of steps, or auto")
_memory_interval = _steps_or_auto(0, "expected a whole number of steps (0: no snapshots), or auto")


class Checkpoint(Section):
    dir: PlainPath | None = Field(None, description="checkpoint directory (default: <run>/checkpoints); must be shared")
    interval: Annotated[
        int | str,
        PlainValidator(_interval),
        WithJsonSchema({"anyOf": [{"type": "integer", "exclusiveMinimum": 0}, {"const": "auto"}]}),
    ] = Field(1000, description="steps between saves, or auto (Young/Daly)")
    keep: PositiveInt = Field(2, description="committed generations to retain")
    async_: bool = Field(False, alias="async", description="save in the background while training continues")
    save_seconds: float | None = Field(
        None, gt=0, description="measured time of one save (default: estimated from the state size and the site's bandwidth)"
    )
    mtbf: Seconds | None = Field(
        None, description="mean time between failures of the whole job (default: the site's node MTBF / nodes)"
    )
    memory_interval: Annotated[int | str, PlainValidator(_memory_interval), WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 0}, {"const": "auto"}]})] = Field("auto", description="steps between"
        " in-memory snapshots (each rank's state in its node's and a peer node's host memory; a restart loses at most"
        " the step in flight; the Contract and the reference trainer): auto is 1 where the plan knows the state's size"
        " and the node's host_memory_gb and they fit, else none; 0: none")


class Restart(Section):
    budget: NonNegativeInt = Field(3, description="restarts after faults (pre-timeout requeues are not counted)")
    mode: Literal["continuation", "requeue", "none"] = Field(
        "continuation", description="how a run continues after leaving the allocation"
    )
    in_allocation: bool = Field(True, description="first try a restart inside the same allocation")
    warm: bool = Field(True, description="fork every attempt's ranks and controller from a server per node (spares"
                       " too) that imported torch once for the job; off, or where it cannot serve: cold starts")
    preimport: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]] = Field(
        default_factory=list, description="more modules the warm servers import (lightning, your package; not one"
        " your command runs with -m)")


class Elastic(Section):
    """Keep training in the allocation on fewer nodes when a verdict excludes one and no spare is left."""

    min_nodes: PositiveInt | None = Field(
        None, description="the fewest nodes the job may shrink to (default: half its nodes, rounded up)")
    min_dp: PositiveInt | None = Field(None, description="the smallest data-parallel size it may shrink to (instead of"
                                       " min_nodes)")
    batch: Literal["keep", "shrink"] = Field(
        "keep", description="keep: the global batch stays exact through gradient accumulation (a width that cannot"
        " keep it is not used); shrink: micro x accumulation stays and the global batch follows dp (the learning"
        " rate is left as it is)")
    grow: bool = Field(True, description="queue a full-size continuation once nodes are free, and move back to it")


class Watchdog(Section):
    hang_timeout: Seconds = Field(120, description="no progress for this long is a hang")
    straggler_factor: float = Field(
        1.25, gt=1.0, description="a straggler's compute time a step is over its peers' median at the same steps by more"
        " than this factor (its peers only: a rank's own earlier steps are no baseline)"
    )
    straggler_min_compute_s: float = Field(
        0.02, ge=0, description="a straggler computes at least this long a step (seconds): below it, ratios are timer jitter"
    )
    straggler_min_lost_s: float = Field(
        0.01, ge=0, description="a straggler loses at least this long a step against its peers (seconds)"
    )
    window: PositiveInt = Field(20, description="steps over which step times are compared")
    save_timeout: Seconds = Field(900, description="a checkpoint save may take this long at most; once a save of the"
                                  " run has ended, one is a hang at 5x the longest so far (at least 60 s)")
    load_timeout: Seconds = Field(900, description="loading a checkpoint may take this long at most; once an earlier"
                                  " attempt has loaded a committed checkpoint, a load is a hang at 5x the longest of"
                                  " those (at least 60 s)")
    steps: Literal["auto", "contract", "off"] = Field(
        "auto",
        description="where step reports come from: auto (torch's optimizer and collective hooks, or the Contract"
        " once the script creates one), contract (the Contract only), off (no step reports)",
    )


class Preflight(Section):
    checks: list[Literal[PREFLIGHT_CHECKS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(DEFAULT_PREFLIGHT),
        description="checks run on every rank before training; comm and compute are opt-in",
    )
    skip: list[Literal[PREFLIGHT_CHECKS]] = Field(  # type: ignore[valid-type]
        default_factory=list,
        exclude=True,  # already applied to `checks`, which run.json and the spec hash carry
        description="checks left out of the default set (`skip: [nic]`) without listing the others",
    )
    timeout: Seconds = Field(120, description="time allowed for the preflight checks")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        # `preflight: comm` or `preflight: [comm, compute]` adds to the defaults.
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            unknown = [v for v in value if v not in PREFLIGHT_CHECKS]
            if unknown:
                raise ValueError(f"unknown check {unknown[0]!r}; expected some of {', '.join(PREFLIGHT_CHECKS)}")
            return {"checks": list(DEFAULT_PREFLIGHT) + [v for v in value if v not in DEFAULT_PREFLIGHT]}
        if isinstance(value, dict) and isinstance(value.get("skip"), str):
            value = {**value, "skip": [value["skip"]]}  # `--set preflight.skip=nic`
        if isinstance(value, dict) and isinstance(value.get("skip"), list) and "checks" not in value:
            # The checks that run are the defaults less the skipped ones; a skipped name that is
            # no check is left to the field's own validation, which names the choices.
            skipped = set(v for v in value["skip"] if isinstance(v, str))
            value = {**value, "checks": [c for c in DEFAULT_PREFLIGHT if c not in skipped]}
        return value

    @field_validator("skip")
    @classmethod
    def _not_also_listed(cls, skip: list[str], info: ValidationInfo) -> list[str]:
        # Without `checks`, the skipped ones are already gone; with it, they must not be in it.
        listed = [name for name in skip if name in (info.data.get("checks") or [])]
        if listed:
            raise ValueError(
                f"{listed[0]!r} is also listed in preflight.checks: skip leaves a check out of the default set; "
                "with an explicit checks list, leave it out of that list instead"
            )
        return skip


DEFAULT_LEAD_S = 300


def default_lead_s(time_limit_s: int) -> int:
    """The pre-timeout lead where the spec gives none: 300 s, or a tenth of a time limit under 50 minutes, so that a
    first short job (`time_limit: 5m`: 30 s) runs rather than being refused for a lead longer than itself."""
    return max(1, min(DEFAULT_LEAD_S, time_limit_s // 10))


class Signal(Section):
    name: Literal[SIGNALS] = Field("USR2", description="pre-timeout signal to the batch shell")  # type: ignore[valid-type]
    lead_s: PositiveInt | None = Field(
        None, le=65535,
        description=f"seconds before the time limit (default: {DEFAULT_LEAD_S}, or a tenth of a time limit under 50 minutes)",
    )

    @field_validator("name", mode="before")
    @classmethod
    def _strip_sig(cls, value: Any) -> Any:
        if isinstance(value, str) and value.upper().startswith("SIG"):
            return value[3:].upper()
        return value.upper() if isinstance(value, str) else value


class Rendezvous(Section):
    port_range: tuple[PositiveInt, PositiveInt] | None = Field(
        None, description="[low, high] for MASTER_PORT (default: the site's)"
    )
    interface: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]+$")] | None = Field(
        None,
        description="network interface (letters, digits, . _ : -) to resolve the master address through"
        " (default: the site's)",
    )
    timeout: Seconds = Field(300, description="time for every rank to register")

    @field_validator("port_range")
    @classmethod
    def _ports(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None:
            lo, hi = value
            if not 1024 <= lo <= hi <= 65535:
                raise ValueError("expected [low, high] with 1024 <= low <= high <= 65535")
        return value


CONTAINER_RUNTIMES = ("pyxis", "apptainer", "none")
MOUNT = r"^[^,:\s\x00-\x1f\x7f]+(:[^,:\s\x00-\x1f\x7f]+(:[a-z,]+)?)?$"


class Container(Section):
    runtime: Literal["pyxis", "apptainer", "none"] | None = Field(
        None, description="how the ranks run in the image: pyxis (srun --container-image), apptainer (apptainer exec)"
        " or none; default: the site's container.runtime"
    )
    image: Annotated[str, Field(pattern=r"^[^\s\x00-\x1f\x7f]+$")] | None = Field(
        None,
        description="container image: a registry reference (pyxis: nvcr.io#nvidia/pytorch:25.01-py3), a .sqsh or .sif"
        " file, or an Apptainer URI; one word, no spaces or control characters; omit the field to run without a container",
    )
    mounts: list[Annotated[str, Field(pattern=MOUNT)]] = Field(
        default_factory=list, description="SRC[:DST[:FLAGS]] bound into the container, after the site's mounts"
        " (the run directory and the submit directory are always bound)"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="variables set inside the container only, by each rank's wrapper (after `env`)"
    )
    writable: bool | None = Field(
        None, description="a writable container (pyxis --container-writable, apptainer --writable-tmpfs); false:"
        " read-only (pyxis --container-readonly); default: the runtime's own"
    )


def _command(value: Any) -> Any:
    return split_command(value) if isinstance(value, str) else value


# --- the spec ----------------------------------------------------------------


class Qualify(Section):
    """`clusterctl qualify`: the ladder's test definition and pass criteria (each rung states its criterion)."""

    steps: PositiveInt = Field(60, description="steps of each short rung's run")
    eval_interval: PositiveInt = Field(10, description="steps between validation losses")
    target_loss: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="quality target (validation loss); time to reach it is the headline"
    )
    nodes: list[PositiveInt] | None = Field(
        None, description="node counts of the scaling rung (default: 1, 2, 4, ... up to nodes)"
    )
    balance: float = Field(1.25, gt=1.0, description="one node: the slowest rank's median step time over the fastest's, at most")
    efficiency: float = Field(0.7, gt=0, le=1.0, description="scaling efficiency (speedup / nodes), at least")
    data_samples: PositiveInt = Field(1024, description="samples in the data rung's token shards (an epoch)")
    long_s: PositiveInt = Field(60, description="seconds of steady training in the long rung")
    loss_tolerance: float = Field(
        0.0, ge=0, description="restart rung: |resumed loss - baseline| allowed per step; 0 is bit for bit"
    )
    recovery_s: Seconds = Field(180, description="failure rung: a killed rank's run must train again within this")


class JobSpec(Section):
    """A training job: what to run, how it is split, and where."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        coerce_numbers_to_str=True,
        title="clusterctl job spec",
        json_schema_extra={"$schema": "https://json-schema.org/draft/2020-12/schema"},
    )

    name: Annotated[str, Field(pattern=JOB_NAME.pattern)] = Field(
        ..., description="job name: letters, digits, . _ -; at most 64 characters"
    )
    site: Annotated[PlainPath, Field(min_length=1)] = Field("local", description="site config name or path")
    partition: Annotated[str, Field(pattern=SLURM_WORD.pattern)] | None = Field(
        None, description="Slurm partition: letters, digits, . _ - (default: the site's default partition)"
    )
    account: Annotated[str, Field(pattern=SLURM_WORD.pattern)] | None = Field(
        None, description="Slurm account: letters, digits, . _ -"
    )
    nodes: PositiveInt | None = Field(None, description="nodes running ranks (derived from the parallel dims)")
    gpus_per_node: PositiveInt | None = Field(None, description="ranks per node (default: the node type's GPUs)")
    spares: NonNegativeInt = Field(0, description="extra nodes allocated to replace failing ones")
    parallel: Parallel = Field(
        default_factory=Parallel, description="parallel dimensions: tp, pp, vpp, cp, ep (dp follows from the ranks)"
    )
    batch: Batch = Field(
        default_factory=Batch, description="micro-batch, global batch and gradient accumulation (two of the three)"
    )
    seq_len: PositiveInt = Field(2048, description="sequence length in tokens")
    model: ModelShape | None = Field(None, description="model size, for the memory estimate and layer checks")
    precision: Precision = Field(default_factory=Precision, description="parameter, gradient and optimizer-state dtypes")
    optimizer: Literal["adam", "adamw", "sgd"] = Field(
        "adamw", description="optimizer, for the memory estimate and the reference trainer"
    )
    sharding: Literal["none", "zero1", "zero2", "zero3", "full_shard", "hybrid_shard"] = Field(
        "none", description="optimizer/gradient/parameter sharding over dp*cp (full_shard = zero3 = FSDP)"
    )
    hybrid_shard_group: PositiveInt | None = Field(
        None, description="ranks per shard group for hybrid_shard (default: the dp*cp ranks on one node)"
    )
    recompute: Literal["none", "selective", "full"] = Field(
        "selective", description="activation recomputation, for the memory estimate: none, selective (attention) or full"
    )
    time_limit: SlurmMinutes = Field(..., description="wall time: 4h, 90m, 1-00:00:00; bare numbers are minutes")
    topology: Topology = Field(
        default_factory=Topology, description="placement: switches, features, nodes to exclude, NVLink rules"
    )
    checkpoint: Checkpoint = Field(
        default_factory=Checkpoint, description="where, how often and how many checkpoints (the recovery contract)"
    )
    restart: Restart = Field(default_factory=Restart, description="what happens after an attempt fails: mode and budget")
    elastic: Elastic | None = Field(None, description="shrink data parallelism in the allocation when no spare is left,"
                                    " and grow back (default: off)")
    watchdog: Watchdog = Field(default_factory=Watchdog, description="hang and straggler detection: timeouts, window, factor")
    preflight: Preflight = Field(default_factory=Preflight, description="checks every rank runs before the rendezvous")
    signal: Signal = Field(default_factory=Signal, description="the pre-timeout signal: which and how long before the time limit")
    rendezvous: Rendezvous = Field(default_factory=Rendezvous, description="the controller's store: timeout and address family")
    container: Container = Field(default_factory=Container, description="a container image the ranks run in (pyxis or Apptainer)")
    modules: list[Annotated[str, Field(pattern=MODULE_NAME.pattern)]] = Field(
        default_factory=list, description="environment modules to load: letters, digits, . _ + / @ -"
    )
    env: Annotated[dict[EnvName, EnvValue], BeforeValidator(lambda v: v if v is not None else {})] = Field(
        default_factory=dict, description=ENV_DESCRIPTION
    )
    secret_env: list[EnvName] = Field(
        default_factory=list,
        description="environment variables whose values the ranks get from the submitting environment but no file"
        " keeps (API keys, passwords): taken at submit, kept out of spec.yaml, job.sbatch, the logs and sbatch's"
        " environment",
    )
    command: Annotated[
        list[Annotated[ScriptText, Field(min_length=1)]], Field(min_length=1), BeforeValidator(_command)
    ] | None = Field(None, description="what each rank runs: an argv list, or a string split like a shell")
    runs_root: PlainPath | None = Field(
        None, description="where run directories go (default: the site's); ~ and $VARIABLES are expanded"
    )
    runs_mode: RunsMode | None = Field(None, description=RUNS_MODE_DESCRIPTION + "; default: the site's")
    runs_group: GroupName | None = Field(None, description="the group `runs_mode: group` shares the run with (default: the site's)")
    qualify: Qualify = Field(default_factory=Qualify, description="clusterctl qualify: test definition and criteria")
    allow_oom: bool = Field(
        False, description="submit even when the plan's memory estimate exceeds the GPU (`--allow-oom`); kept in the run's spec"
    )

    @property
    def lead_s(self) -> int:
        """How long before the time limit the pre-timeout signal comes: signal.lead_s, else default_lead_s."""
        return self.signal.lead_s if self.signal.lead_s is not None else default_lead_s(int(self.time_limit))



def _cross_checks(spec: JobSpec) -> list[Problem]:
    """Rules that tie fields of different sections together."""
    problems = []
    if spec.signal.lead_s is not None and spec.signal.lead_s >= spec.time_limit:
        problems.append(
            Problem(
                "time_limit",
                format_duration(spec.time_limit),
                f"expected more than signal.lead_s = {spec.signal.lead_s} s (the pre-timeout warning);"
                " raise time_limit or lower signal.lead_s",
            )
        )
    for name in sorted(set(spec.secret_env) & set(spec.env)):
        problems.append(Problem(f"env.{name}", "(a value)", "a name in secret_env takes its value from the submitting"
                                " environment: remove it from env"))
    if spec.elastic is not None and spec.elastic.min_nodes is not None and spec.elastic.min_dp is not None:
        problems.append(Problem("elastic.min_dp", spec.elastic.min_dp, "give min_nodes or min_dp, not both"))
    if spec.hybrid_shard_group is not None and spec.sharding != "hybrid_shard":
        problems.append(
            Problem("hybrid_shard_group", spec.hybrid_shard_group, "only allowed with sharding: hybrid_shard")
        )
    return problems


def spec_from_located(located: Located, overrides: list[str] | None = None) -> JobSpec:
    """Validate parsed YAML (plus overrides) into a JobSpec or raise ConfigError."""
    located = located.with_overrides(overrides or [])
    spec = validate_located(JobSpec, located, data=located.as_written(("env", "command")))
    problems = located.with_lines(_cross_checks(spec))
    if problems:
        raise ConfigError(located.source, problems)
    return spec


def load_spec(path: Path | str, overrides: list[str] | None = None) -> JobSpec:
    """Read job.yaml, apply `--set` overrides, validate."""
    return spec_from_located(load_yaml(Path(path), "job spec"), overrides)
