"""The job spec: what a user writes, what it means, and how each mistake is reported.

Error tests check four things each time: exit code 65 (ConfigError, and the
CLI's exit status), a message naming the field path, the bad value and what is
allowed (with the line in the file, or "from --set"), no traceback, and
nothing written.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    EXAMPLE_FILES,
    EXAMPLES,
    assert_names,
    expect_cli_config_error,
    expect_config_error,
    line_of,
    minimal_site,
    problem_at,
    write_spec,
    write_yaml,
)
from pydantic import ValidationError

from clusterctl.config.site import shipped_sites
from clusterctl.config.spec import DEFAULT_PREFLIGHT, JobSpec, load_spec
from clusterctl.errors import MISSING, OMIT, ConfigError
from clusterctl.plan.job import load_job

# --- the examples ----------------------------------------------------------------


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLE_FILES} >= {"quickstart.yaml", "llama-70b.yaml", "mixtral-8x7b.yaml"}


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_every_example_loads_and_plans_cleanly(example: Path) -> None:
    spec = load_spec(example)
    assert spec.name == example.stem
    job = load_job(example)
    assert job.site.name == spec.site
    assert job.plan.warnings == []
    assert job.spec.model is None or (job.plan.memory is not None and job.plan.memory.fits)
    assert job.plan.world_size == job.plan.nodes * job.plan.gpus_per_node


# --- defaults and the forms a user may write -----------------------------------------


def test_defaults(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    par = spec.parallel
    assert (par.tp, par.pp, par.cp, par.ep, par.vpp, par.dp) == (1, 1, 1, 1, 1, None)
    assert spec.signal.name == "USR2"
    assert spec.site == "local"
    assert spec.preflight.checks == list(DEFAULT_PREFLIGHT)
    assert "comm" not in spec.preflight.checks and "compute" not in spec.preflight.checks
    assert spec.precision.compute == "bf16"
    assert (spec.precision.params_dtype, spec.precision.master_dtype) == ("bf16", "fp32")
    assert spec.env == {} and spec.command is None and spec.model is None


@pytest.mark.parametrize(
    ("written", "compute", "params", "grads", "master"),
    [
        ("bf16", "bf16", "bf16", "bf16", "fp32"),
        ("fp16", "fp16", "fp16", "fp16", "fp32"),
        ("fp32", "fp32", "fp32", "fp32", "none"),
        ("fp8", "fp8", "bf16", "bf16", "fp32"),
        ({"compute": "bf16", "params": "fp32"}, "bf16", "fp32", "fp32", "none"),
        ({"compute": "bf16", "master": "bf16"}, "bf16", "bf16", "bf16", "bf16"),
    ],
)
def test_precision_shorthand_and_derived_dtypes(
    tmp_path: Path, written: Any, compute: str, params: str, grads: str, master: str
) -> None:
    p = load_spec(write_spec(tmp_path, precision=written)).precision
    assert (p.compute, p.params_dtype, p.grads_dtype, p.master_dtype) == (compute, params, grads, master)


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        ("4h", 4 * 3600),
        ("90m", 90 * 60),
        ("45s", 45),
        ("2d", 2 * 86400),
        ("1.5h", 5400),
        ("1-00:00:00", 86400),
        ("1-12", 86400 + 12 * 3600),
        ("02:00:00", 7200),
        ("10:30", 10 * 60 + 30),
        (30, 30 * 60),
        ("30", 30 * 60),
    ],
)
def test_time_limit_formats(tmp_path: Path, written: Any, seconds: int) -> None:
    # A short limit needs a shorter pre-timeout lead than the default 300 s.
    spec = load_spec(write_spec(tmp_path, time_limit=written, signal={"lead_s": 10}))
    assert spec.time_limit == seconds


@pytest.mark.parametrize(
    ("written", "count"),
    [("7B", 7_000_000_000), ("350M", 350_000_000), ("1.5T", 1_500_000_000_000), ("7b", 7_000_000_000), (7_000_000_000, 7_000_000_000)],
)
def test_params_counts(tmp_path: Path, written: Any, count: int) -> None:
    assert load_spec(write_spec(tmp_path, model={"params": written})).model.params == count


def test_command_string_is_split_like_a_shell(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, command="python train.py --name 'my run' --tag \"a b\" x\\ y"))
    assert spec.command == ["python", "train.py", "--name", "my run", "--tag", "a b", "x y"]


def test_command_list_is_kept_as_argv(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, command=["python", "-c", "print('a b')"]))
    assert spec.command == ["python", "-c", "print('a b')"]


def test_preflight_shorthand_adds_to_the_default_checks(tmp_path: Path) -> None:
    assert load_spec(write_spec(tmp_path, preflight="comm")).preflight.checks == [*DEFAULT_PREFLIGHT, "comm"]
    both = load_spec(write_spec(tmp_path, preflight=["comm", "compute", "gpu"])).preflight.checks
    assert both == [*DEFAULT_PREFLIGHT, "comm", "compute"]
    # The long form replaces the list.
    assert load_spec(write_spec(tmp_path, preflight={"checks": ["gpu"]})).preflight.checks == ["gpu"]


def test_env_numbers_and_booleans_become_strings(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, env={"N": 1, "ON": True, "OFF": False, "F": 1.5, "S": "text"}))
    assert spec.env == {"N": "1", "ON": "true", "OFF": "false", "F": "1.5", "S": "text"}  # as written
    assert all(isinstance(v, str) for v in spec.env.values())


def test_env_values_keep_the_text_as_written(tmp_path: Path) -> None:
    spec_path = write_yaml(tmp_path, "name: t\ntime_limit: 1h\nenv:\n  A: 010\n  B: 0.10\n  C: 0x1F\n")
    assert load_spec(spec_path).env == {"A": "010", "B": "0.10", "C": "0x1F"}


def test_async_and_global_aliases(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, checkpoint={"async": True}, batch={"micro": 2, "global": 64}))
    assert spec.checkpoint.async_ is True
    assert spec.batch.global_ == 64
    assert load_spec(write_spec(tmp_path)).checkpoint.async_ is False


@pytest.mark.parametrize("written", ["SIGUSR1", "usr1", "USR1"])
def test_signal_name_forms(tmp_path: Path, written: str) -> None:
    assert load_spec(write_spec(tmp_path, signal={"name": written})).signal.name == "USR1"


def test_the_lead_is_the_specs_or_a_tenth_of_a_short_limit(tmp_path: Path) -> None:
    assert load_spec(write_spec(tmp_path, time_limit="10m", signal={"lead_s": 599})).lead_s == 599
    # Left out, the lead is 300 s, or a tenth of a short limit: a first 5-minute job runs, told 30 s before its end.
    assert [load_spec(write_spec(tmp_path, time_limit=t)).lead_s for t in ("5m", "10m", "50m", "4h")] == [30, 60, 300, 300]


def test_spec_is_frozen(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    with pytest.raises(ValidationError, match="frozen"):
        spec.name = "other"  # type: ignore[misc]


# --- errors in the spec itself -------------------------------------------------------

BAD_NAMES = ["my job", "a$(id)", "a`id`", "it's", 'say"hi"', "a\nb", "-lead", "x" * 65]

# (id, fields or raw YAML, path, value, fragments of what is allowed, needle locating the line or None)
SPEC_ERRORS: list[tuple[str, Any, str, Any, tuple[str, ...], str | None]] = [
    ("unknown-top", {"optimiser": "adamw"}, "optimiser", OMIT, ("unknown key", "did you mean 'optimizer'?", "valid keys here: name, site,"), "optimiser:"),
    ("unknown-nested", {"checkpoint": {"keep": 2, "intervall": 10}}, "checkpoint.intervall", OMIT, ("did you mean 'interval'?", "valid keys here: dir, interval, keep, async"), "intervall:"),
    ("type-int", {"nodes": "two"}, "nodes", "two", ("expected a whole number: nodes running ranks (derived from the parallel dims)",), "nodes:"),
    ("type-float", {"parallel": {"tp": 1.5}}, "parallel.tp", 1.5, ("expected a whole number", "tensor parallel size"), "tp: 1.5"),
    ("type-mapping", {"parallel": 3}, "parallel", 3, ("expected a mapping",), "parallel:"),
    ("type-env", {"env": ["A=1"]}, "env", ["A=1"], ("expected a mapping",), "env:"),
    ("type-list", {"modules": "cuda/12"}, "modules", "cuda/12", ("expected a list",), "modules:"),
    ("zero-nodes", {"nodes": 0}, "nodes", 0, ("greater than 0",), "nodes:"),
    ("negative-nodes", {"nodes": -1}, "nodes", -1, ("greater than 0",), "nodes:"),
    ("zero-tp", {"parallel": {"tp": 0}}, "parallel.tp", 0, ("greater than 0",), "tp: 0"),
    ("zero-seq", {"seq_len": 0}, "seq_len", 0, ("greater than 0",), "seq_len:"),
    ("negative-spares", {"spares": -1}, "spares", -1, ("at least 0",), "spares:"),
    ("zero-micro", {"batch": {"micro": 0}}, "batch.micro", 0, ("greater than 0",), "micro:"),
    ("zero-time", {"time_limit": 0}, "time_limit", 0, ("positive duration",), "time_limit:"),
    ("bad-time", {"time_limit": "forever"}, "time_limit", "forever", ("90s, 15m, 4h or 1-00:00:00",), "time_limit:"),
    ("straggler", {"watchdog": {"straggler_factor": 1.0}}, "watchdog.straggler_factor", 1.0, ("greater than 1.0",), "straggler_factor:"),
    ("lead-max", {"time_limit": "2d", "signal": {"lead_s": 70000}}, "signal.lead_s", 70000, ("at most 65535",), "lead_s:"),
    ("enum-optimizer", {"optimizer": "lamb"}, "optimizer", "lamb", ("one of adam, adamw, sgd",), "optimizer:"),
    ("enum-sharding", {"sharding": "zero4"}, "sharding", "zero4", ("one of none, zero1, zero2, zero3, full_shard, hybrid_shard",), "sharding:"),
    ("enum-signal", {"signal": {"name": "KILL"}}, "signal.name", "KILL", ("one of USR1, USR2, TERM",), "name: KILL"),
    ("enum-precision", {"precision": "fp64"}, "precision.compute", "fp64", ("one of fp32, bf16, fp16, fp8",), "precision:"),
    ("enum-recompute", {"recompute": "partial"}, "recompute", "partial", ("one of none, selective, full",), "recompute:"),
    ("enum-restart", {"restart": {"mode": "again"}}, "restart.mode", "again", ("one of continuation, requeue, none",), "mode:"),
    ("env-nul", 'name: t\ntime_limit: 1h\nenv:\n  A: "x\\0y"\n', "env.A", "x\x00y", ("without NUL",), "A:"),
    ("env-list-value", {"env": {"A": [1]}}, "env.A", [1], ("a string, number or boolean",), "A:"),
    ("missing-name", "time_limit: 1h\n", "name", MISSING, ("this field is required", "letters, digits"), None),
    ("missing-time", "name: t\n", "time_limit", MISSING, ("this field is required", "4h, 90m, 1-00:00:00"), None),
    ("lead-ge-limit", {"time_limit": "10m", "signal": {"lead_s": 600}}, "time_limit", "10m00s", ("more than signal.lead_s = 600 s",), "time_limit:"),
    ("hybrid-group", {"sharding": "zero3", "hybrid_shard_group": 4}, "hybrid_shard_group", 4, ("only allowed with sharding: hybrid_shard",), "hybrid_shard_group:"),
    ("model-empty", {"model": {"layers": 2}}, "model", OMIT, ("give either params, or the shape", "missing: hidden, heads, vocab"), "model:"),
    ("model-heads", {"model": {"layers": 2, "hidden": 100, "heads": 3, "vocab": 10}}, "model", OMIT, ("hidden (100) must be divisible by heads (3)",), "model:"),
    ("model-kv", {"model": {"layers": 2, "hidden": 64, "heads": 8, "kv_heads": 3, "vocab": 10}}, "model", OMIT, ("heads (8) must be divisible by kv_heads (3)",), "model:"),
    ("command-quote", {"command": "python 'unclosed"}, "command", "python 'unclosed", ("split the command like a shell", "No closing quotation"), "command:"),
    ("command-empty", {"command": "  "}, "command", "  ", ("non-empty command",), "command:"),
    ("ports-low", {"rendezvous": {"port_range": [100, 200]}}, "rendezvous.port_range", [100, 200], ("1024 <= low <= high <= 65535",), "port_range:"),
    ("ports-reversed", {"rendezvous": {"port_range": [30000, 20000]}}, "rendezvous.port_range", [30000, 20000], ("low <= high",), "port_range:"),
    ("mount", {"container": {"mounts": ["/a b"]}}, "container.mounts[0]", "/a b", ("SRC[:DST[:FLAGS]]",), "- /a b"),
    ("features", {"topology": {"features": ["a;b"]}}, "topology.features[0]", "a;b", ("node features",), "- a;b"),
] + [
    (f"name-{i}", {"name": bad}, "name", bad, ("letters, digits, . _ -", "at most 64 characters"), "name:")
    for i, bad in enumerate(BAD_NAMES)
]


# The CLI prints messages as rich markup, which swallows "[low, high]" (see
# test_cli.py::test_error_text_is_not_read_as_markup); for these the CLI check
# looks for the path and value only.
CLI_SHOWS_PART = {"ports-low", "ports-reversed"}


def _write(tmp_path: Path, content: Any) -> Path:
    return write_yaml(tmp_path, content) if isinstance(content, str) else write_spec(tmp_path, **content)


@pytest.mark.parametrize(
    ("content", "path", "value", "allowed", "needle", "cli_full"),
    [pytest.param(*case[1:], case[0] not in CLI_SHOWS_PART, id=case[0]) for case in SPEC_ERRORS],
)
def test_spec_error(
    tmp_path: Path, content: Any, path: str, value: Any, allowed: tuple[str, ...], needle: str | None, cli_full: bool
) -> None:
    spec = _write(tmp_path, content)
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert len(err.problems) == 1, str(err)
    assert str(spec) in str(err)
    line = line_of(spec, needle) if needle else None
    problem = assert_names(err, path, value, *allowed, line=line)
    shown = problem.render() if cli_full else f"{path} (line {line}): got {value!r}"
    expect_cli_config_error(["plan", spec], tmp_path, str(spec), shown)


def test_unknown_key_lists_every_valid_key(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, parallel={"tp": 2, "ddp": 2})
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    problem = assert_names(err, "parallel.ddp", OMIT, "did you mean 'dp'?", line=line_of(spec, "ddp:"))
    assert problem.allowed.endswith("valid keys here: tp, pp, dp, cp, ep, vpp")
    bogus = write_spec(tmp_path, "bogus.yaml", bogus=1)
    top = expect_config_error(lambda: load_spec(bogus), tmp_path)
    listed = problem_at(top, "bogus").allowed.split("valid keys here: ")[1].split(", ")
    assert listed == [info.alias or name for name, info in JobSpec.model_fields.items()]
    assert "did you mean" not in problem_at(top, "bogus").allowed  # nothing close to suggest


def test_bad_env_var_names(tmp_path: Path) -> None:
    for bad in ("1BAD", "A-B", "A$B", "A B"):
        spec = write_spec(tmp_path, env={"GOOD": "1", bad: "x"})
        err = expect_config_error(lambda: load_spec(spec), tmp_path)
        assert_names(err, f"env.{bad}", bad, "letters, digits and _")
        expect_cli_config_error(["plan", spec], tmp_path, bad)


def test_bad_env_var_name_points_at_the_key(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, env={"GOOD": "1", "1BAD": "x"})
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert_names(err, "env.1BAD", "1BAD", "environment variable name", line=line_of(spec, "1BAD"))


def test_several_problems_are_reported_together(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, nodes=0, optimizer="lamb", parallel={"tpp": 2})
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert {p.path for p in err.problems} == {"nodes", "optimizer", "parallel.tpp"}
    assert "3 problems" in str(err)
    for problem in err.problems:
        assert problem.line is not None


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("name: t\ntime_limit: 1h\nnodes: [1, 2\nseq_len: 5\n", 3, "the `[` on this line is never closed (line 4: "),
        ("name: t\ntime_limit: 1h\n\tnodes: 2\n", 3, "'\\t'"),
        ("name: t\ntime_limit: 1h\n  bad: indent\n", 3, "mapping values are not allowed here"),
        ("name: t\ntime_limit: 1h\nparallel: {tp: 2\n", 3, "the `{` on this line is never closed"),
        ("name: t\ntime_limit: 1h\nenv: {A: \"1\"\ncommand: [python3, t.py]\n", 3, "near `command: [python3, t.py]`"),
    ],
    ids=["unclosed-list", "tab", "indent", "unclosed-flow", "unclosed-flow-then-key"],
)
def test_malformed_yaml_names_the_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    spec = write_yaml(tmp_path, text)
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert len(err.problems) == 1
    assert_names(err, "", OMIT, "malformed YAML", fragment, line=line)
    expect_cli_config_error(["plan", spec], tmp_path, f"line {line}: malformed YAML", fragment)


@pytest.mark.parametrize(
    ("text", "path", "first", "line"),
    [
        ("name: t\ntime_limit: 1h\nname: u\n", "name", 1, 3),
        ("name: t\ntime_limit: 1h\nparallel:\n  tp: 2\n  pp: 1\n  tp: 4\n", "parallel.tp", 4, 6),
    ],
    ids=["top", "nested"],
)
def test_duplicate_key(tmp_path: Path, text: str, path: str, first: int, line: int) -> None:
    spec = write_yaml(tmp_path, text)
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert_names(err, path, OMIT, f"duplicate key (first given on line {first})", line=line)
    expect_cli_config_error(["plan", spec], tmp_path, f"{path} (line {line}): duplicate key")


@pytest.mark.parametrize(("text", "value"), [("- a\n- b\n", ["a", "b"]), ("just words\n", "just words"), ("42\n", 42)])
def test_yaml_that_is_not_a_mapping(tmp_path: Path, text: str, value: Any) -> None:
    spec = write_yaml(tmp_path, text)
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert_names(err, "", value, "expected a mapping of fields", line=1)
    expect_cli_config_error(["plan", spec], tmp_path, "expected a mapping of fields")


def test_empty_file_reports_both_required_fields(tmp_path: Path) -> None:
    spec = write_yaml(tmp_path, "# nothing yet\n")
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert [p.path for p in err.problems] == ["name", "time_limit"]
    assert all(p.value is MISSING and "required" in p.allowed for p in err.problems)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    err = expect_config_error(lambda: load_spec(missing), tmp_path)
    assert_names(err, "", OMIT, "no such file")
    assert str(missing) in str(err)
    expect_cli_config_error(["plan", missing], tmp_path, str(missing), "no such file")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    err = expect_config_error(lambda: load_spec(tmp_path / "specs"), tmp_path)
    assert_names(err, "", OMIT, "is a directory")


def test_recursive_yaml_alias_is_a_config_error(tmp_path: Path) -> None:
    spec = write_yaml(tmp_path, "name: t\ntime_limit: 1h\nenv: &a {A: *a}\n")
    expect_config_error(lambda: load_spec(spec), tmp_path)


@pytest.mark.parametrize("bad", ["sometimes", 0])
def test_bad_checkpoint_interval_is_one_problem(tmp_path: Path, bad: Any) -> None:
    spec = write_spec(tmp_path, checkpoint={"interval": bad})
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert [p.path for p in err.problems] == ["checkpoint.interval"]
    assert_names(err, "checkpoint.interval", bad, "auto")


def test_empty_command_list_is_rejected(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, command=[])
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert_names(err, "command", [], "at least 1 item")


def test_bad_preflight_shorthand_points_at_what_was_written(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, preflight="bogus")
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert len(err.problems) == 1
    assert err.problems[0].path in ("preflight", "preflight[0]")


def test_bad_preflight_check_names_the_choices(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, preflight={"checks": ["gpu", "bogus"]})
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert_names(err, "preflight.checks[1]", "bogus", "one of gpu, nic, cpu, memory, dirs, shared_fs, comm, compute", line=line_of(spec, "- bogus"))


def test_bad_partition_name_says_what_is_allowed(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, partition="p q")
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    problem = assert_names(err, "partition", "p q")
    assert "letters" in problem.allowed and "digits" in problem.allowed


# --- --set overrides ------------------------------------------------------------------


def test_set_overrides_ints_and_strings(tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path, parallel={"tp": 2}, seq_len=2048)
    spec = load_spec(spec_path, ["parallel.tp=4", "seq_len=4096", "name=other", "optimizer=sgd"])
    assert spec.parallel.tp == 4 and isinstance(spec.parallel.tp, int)
    assert (spec.seq_len, spec.name, spec.optimizer) == (4096, "other", "sgd")
    # The last of two overrides of one field wins; the file is unchanged.
    assert load_spec(spec_path, ["parallel.tp=4", "parallel.tp=8"]).parallel.tp == 8
    assert load_spec(spec_path).parallel.tp == 2


def test_set_creates_missing_sections(tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path)
    spec = load_spec(spec_path, ["checkpoint.keep=5", "env.FOO=bar", "checkpoint.async=true"])
    assert spec.checkpoint.keep == 5
    assert spec.checkpoint.async_ is True
    assert spec.checkpoint.interval == 1000  # the rest of the section keeps its defaults
    assert spec.env == {"FOO": "bar"}


def test_set_list_index(tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path, command=["python", "train.py", "--lr", "0.1"])
    assert load_spec(spec_path, ["command.1=other.py"]).command == ["python", "other.py", "--lr", "0.1"]
    assert load_spec(spec_path, ["command=[a, b]"]).command == ["a", "b"]


def test_set_number_like_value_into_a_string_field(tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path, command=["python", "train.py", "--lr", "0.1"])
    assert load_spec(spec_path, ["command.3=0.2"]).command == ["python", "train.py", "--lr", "0.2"]


@pytest.mark.parametrize(
    ("override", "allowed"),
    [
        ("checkpoint.keep", "expected FIELD.PATH=VALUE, e.g. parallel.tp=8"),
        ("=5", "expected FIELD.PATH=VALUE"),
        ("a..b=5", "expected FIELD.PATH=VALUE"),
        ("command.5=x", "a list index from 0 to 1"),
        ("command.x=x", "a list index from 0 to 1"),
    ],
)
def test_malformed_set(tmp_path: Path, override: str, allowed: str) -> None:
    spec_path = write_spec(tmp_path, command=["a", "b"])
    err = expect_config_error(lambda: load_spec(spec_path, [override]), tmp_path)
    problem = assert_names(err, "--set", override, allowed)
    assert problem.line is None
    expect_cli_config_error(["plan", spec_path, "--set", override], tmp_path, problem.render())


def test_set_problems_are_marked_and_file_problems_carry_lines(tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path, seq_len=0)
    err = expect_config_error(lambda: load_spec(spec_path, ["nodes=0", "checkpoint.kep=3"]), tmp_path)
    from_file = assert_names(err, "seq_len", 0, "greater than 0", line=line_of(spec_path, "seq_len:"))
    assert from_file.note == ""
    for path in ("nodes", "checkpoint.kep"):
        problem = assert_names(err, path, line=None)
        assert problem.note == "from --set"
        assert f"{problem.render()}" in str(err) and problem.render().endswith("(from --set)")
    assert "did you mean 'keep'?" in problem_at(err, "checkpoint.kep").allowed


def test_set_list_index_problem_is_marked(tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path, command=["a", "b"])
    err = expect_config_error(lambda: load_spec(spec_path, ["command.1="]), tmp_path)
    problem = assert_names(err, "command[1]", "", line=None)
    assert problem.note == "from --set"


# --- planner errors, through load_job -------------------------------------------------

MODEL = {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 1000}

# (id, fields on top of site dgx-h100, path, value, allowed fragments, line needle)
PLAN_ERRORS: list[tuple[str, dict[str, Any], str, Any, tuple[str, ...], str]] = [
    ("world-vs-nodes", {"nodes": 2, "parallel": {"tp": 8, "dp": 4}}, "nodes", 2,
     ("expected 4 nodes", "tp*cp*dp*pp = 8*1*4*1 = 32 ranks at 8 per node"), "nodes:"),
    ("dp-not-whole", {"nodes": 3, "parallel": {"tp": 8, "pp": 2}}, "nodes", 3,
     ("24 ranks, not a multiple of tp*cp*pp = 16",), "nodes:"),
    ("mp-not-filling", {"parallel": {"tp": 3}, "topology": {"tp_in_nvlink": False}}, "parallel", OMIT,
     ("tp*cp*pp = 3 does not fill whole nodes of 8 GPUs", "set nodes, parallel.dp or gpus_per_node"), "parallel:"),
    ("ep-divides-dp-cp", {"nodes": 1, "parallel": {"tp": 2, "ep": 3}, "model": {**MODEL, "experts": 6}}, "parallel.ep", 3,
     ("a divisor of dp*cp = 4*1 = 4",), "ep: 3"),
    ("tp-nvlink", {"nodes": 2, "parallel": {"tp": 16}}, "parallel.tp", 16,
     ("one NVLink domain of 8 GPUs", "H100-SXM5-80GB", "tp <= 8", "topology.tp_in_nvlink: false"), "tp: 16"),
    ("tp-cp-nvlink", {"nodes": 2, "parallel": {"tp": 4, "cp": 4}, "topology": {"tp_cp_in_nvlink": True}}, "parallel.cp", 4,
     ("tp*cp = 16 must fit inside one NVLink domain of 8 GPUs", "topology.tp_cp_in_nvlink: false"), "cp: 4"),
    ("global-not-divisible", {"nodes": 1, "parallel": {"tp": 2}, "batch": {"micro": 2, "global": 10}}, "batch.global", 10,
     ("a multiple of micro x dp = 2 x 4 = 8", "e.g. 8 or 16"), "global:"),
    ("batch-inconsistent", {"nodes": 1, "parallel": {"tp": 2}, "batch": {"micro": 2, "global": 16, "grad_accum": 3}}, "batch", OMIT,
     ("global (16) must equal micro x grad_accum x dp = 2 x 3 x 4 = 24", "give only two of them"), "batch:"),
    ("layers-pp-vpp", {"nodes": 1, "parallel": {"tp": 2, "pp": 4, "vpp": 3}, "model": MODEL}, "model.layers", 8,
     ("a multiple of pp*vpp = 4*3 = 12",), "layers:"),
    ("vpp-without-pp", {"nodes": 1, "parallel": {"tp": 8, "vpp": 2}}, "parallel.vpp", 2,
     ("expected 1 without pipeline parallelism",), "vpp:"),
    ("seq-cp", {"nodes": 1, "parallel": {"tp": 2, "cp": 4}, "seq_len": 100}, "seq_len", 100,
     ("a multiple of 2*cp = 8",), "seq_len:"),
    ("heads-tp", {"nodes": 1, "parallel": {"tp": 8}, "model": {**MODEL, "heads": 4}}, "model.heads", 4,
     ("a multiple of tp = 8",), "heads:"),
    ("kv-heads-tp", {"nodes": 1, "parallel": {"tp": 8}, "model": {**MODEL, "kv_heads": 4}}, "model.kv_heads", 4,
     ("a multiple of tp = 8",), "kv_heads:"),
    ("experts-ep", {"nodes": 1, "parallel": {"tp": 2, "ep": 4}, "model": {**MODEL, "experts": 6}}, "model.experts", 6,
     ("a multiple of ep = 4",), "experts:"),
    ("ep-dense", {"nodes": 1, "parallel": {"tp": 2, "ep": 4}, "model": MODEL}, "parallel.ep", 4,
     ("expected 1 for a dense model",), "ep: 4"),
    ("gpus-per-node", {"nodes": 1, "gpus_per_node": 16}, "gpus_per_node", 16,
     ("at most 8", "H100-SXM5-80GB"), "gpus_per_node:"),
    ("too-many-nodes", {"nodes": 200}, "nodes", 200,
     ("partition batch has 128 nodes; the job needs 200",), "nodes:"),
    ("nodes-with-spares", {"nodes": 127, "spares": 2}, "nodes", 127,
     ("partition batch has 128 nodes; the job needs 127 + 2 spares",), "nodes:"),
    ("partition-max-time", {"nodes": 1, "time_limit": "3d"}, "time_limit", "3d00h",
     ("at most partition batch's limit 2-00:00:00",), "time_limit:"),
    ("debug-max-time", {"nodes": 1, "partition": "debug", "time_limit": "3h"}, "time_limit", "3h00m",
     ("at most partition debug's limit 02:00:00",), "time_limit:"),
    ("unknown-partition", {"nodes": 1, "partition": "nope"}, "partition", "nope",
     ("a partition of site dgx-h100: batch, debug",), "partition:"),
    ("port-range-ephemeral", {"nodes": 1, "rendezvous": {"port_range": [40000, 40010]}}, "rendezvous.port_range", [40000, 40010],
     ("outside the site's ephemeral ports 32768-60999",), "port_range:"),
    ("port-range-straddles", {"nodes": 1, "rendezvous": {"port_range": [20000, 40010]}}, "rendezvous.port_range", [20000, 40010],
     ("outside the site's ephemeral ports",), "port_range:"),
]


@pytest.mark.parametrize(
    ("fields", "path", "value", "allowed", "needle"),
    [case[1:] for case in PLAN_ERRORS],
    ids=[case[0] for case in PLAN_ERRORS],
)
def test_plan_error(tmp_path: Path, fields: dict[str, Any], path: str, value: Any, allowed: tuple[str, ...], needle: str) -> None:
    spec = write_spec(tmp_path, site="dgx-h100", **fields)
    err = expect_config_error(lambda: load_job(spec), tmp_path)
    assert len(err.problems) == 1, str(err)
    problem = assert_names(err, path, value, *allowed, line=line_of(spec, needle))
    expect_cli_config_error(["plan", spec], tmp_path, str(spec), problem.render())


def test_plan_site_given_by_option_overrides_the_spec(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, site="local", nodes=2, parallel={"tp": 16})
    err = expect_config_error(lambda: load_job(spec, site="dgx-h100"), tmp_path)
    assert_names(err, "parallel.tp", 16, "NVLink domain of 8 GPUs")


def test_tp_outside_nvlink_is_allowed_when_asked(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, site="dgx-h100", nodes=2, parallel={"tp": 16}, topology={"tp_in_nvlink": False})
    plan = load_job(spec).plan
    assert plan.world_size == 16
    assert plan.groups["tp"] == [list(range(16))]
    assert plan.traffic["tp"].cross_node == 1


def test_tp_cp_may_span_domains_unless_asked(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, site="dgx-h100", nodes=2, parallel={"tp": 4, "cp": 4})
    plan = load_job(spec).plan
    assert plan.groups["tp_cp"][0] == list(range(16))
    # tp*cp = 8 fits one domain even when asked.
    fits = write_spec(tmp_path, "fits.yaml", site="dgx-h100", nodes=2, parallel={"tp": 4, "cp": 2}, topology={"tp_cp_in_nvlink": True})
    assert load_job(fits).plan.dims.layout.dp == 2


@pytest.mark.parametrize(
    ("batch", "accum", "global_batch"),
    [({"micro": 2, "grad_accum": 3}, 3, 24), ({"micro": 2, "global": 24}, 3, 24), ({"micro": 2}, 1, 8), ({"micro": 2, "global": 24, "grad_accum": 3}, 3, 24)],
    ids=["derive-global", "derive-accum", "derive-both", "consistent"],
)
def test_batch_derivations(tmp_path: Path, batch: dict[str, int], accum: int, global_batch: int) -> None:
    spec = write_spec(tmp_path, site="dgx-h100", nodes=1, parallel={"tp": 2}, batch=batch)  # dp = 4
    plan = load_job(spec).plan
    assert (plan.batch.micro, plan.batch.grad_accum, plan.batch.global_batch, plan.batch.dp) == (2, accum, global_batch, 4)


def test_dp_is_derived_from_nodes(tmp_path: Path) -> None:
    plan = load_job(write_spec(tmp_path, site="dgx-h100", nodes=4, parallel={"tp": 8, "pp": 2})).plan
    assert (plan.dims.layout.dp, plan.world_size, plan.nodes) == (2, 32, 4)
    plan = load_job(write_spec(tmp_path, site="dgx-h100", parallel={"tp": 8, "pp": 2, "dp": 3})).plan
    assert (plan.nodes, plan.world_size) == (6, 48)


def test_world_not_filling_nodes_suggests_no_fraction(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, site="dgx-h100", nodes=1, parallel={"tp": 2, "dp": 3})
    err = expect_config_error(lambda: load_job(spec), tmp_path)
    assert "0.75" not in str(err)


def test_time_limit_over_partition_shows_a_readable_value(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, site="dgx-h100", nodes=1, time_limit="3d")
    err = expect_config_error(lambda: load_job(spec), tmp_path)
    text = str(err)
    assert any(form in text for form in ("'3d'", "259200s", "3-00:00:00", "72h", "3d00h"))


def test_unknown_site_lists_the_shipped_sites(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, nodes=1)
    err = expect_config_error(lambda: load_job(spec, site="nosuch"), tmp_path)
    problem = assert_names(err, "site", "nosuch", "or a path to a site YAML file")
    for name in shipped_sites():
        assert name in problem.allowed
    expect_cli_config_error(["plan", spec, "--site", "nosuch"], tmp_path, ", ".join(shipped_sites()))


def test_unknown_site_in_the_file_carries_its_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, site="nosuch", nodes=1)
    err = expect_config_error(lambda: load_job(spec), tmp_path)
    assert_names(err, "site", "nosuch", line=line_of(spec, "site:"))
    assert str(spec) in str(err)


def test_site_path_relative_to_the_spec(tmp_path: Path) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    write_yaml(sites, minimal_site(), "mini.yaml")
    spec = write_spec(tmp_path, site="sites/mini.yaml", nodes=2)
    job = load_job(spec)
    assert job.site.name == "mini"
    assert job.site_path == sites / "mini.yaml"
    assert job.plan.world_size == 4
    gone = write_spec(tmp_path, "gone.yaml", site="sites/gone.yaml")
    err = expect_config_error(lambda: load_job(gone), tmp_path)
    assert_names(err, "site", str(tmp_path / "sites" / "gone.yaml"), "an existing site YAML file")


def test_plan_problems_from_the_file_and_from_set(tmp_path: Path) -> None:
    spec = tmp_path / "llama.yaml"
    shutil.copy(EXAMPLES / "llama-70b.yaml", spec)
    err = expect_config_error(lambda: load_job(spec, ["parallel.tp=16"]), tmp_path)
    assert {p.path for p in err.problems} == {"model.kv_heads", "parallel.tp"}
    kv = assert_names(err, "model.kv_heads", 8, "a multiple of tp = 16", line=line_of(spec, "kv_heads:"))
    assert kv.note == ""
    tp = assert_names(err, "parallel.tp", 16, "NVLink domain of 8 GPUs", line=None)
    assert tp.note == "from --set"
    assert f"parallel.tp: got 16; {tp.allowed} (from --set)" in str(err)
    expect_cli_config_error(
        ["plan", spec, "--set", "parallel.tp=16"],
        tmp_path,
        "2 problems",
        f"model.kv_heads (line {kv.line}): got 8",
        "parallel.tp: got 16;",
        "(from --set)",
    )


def test_plan_problem_from_set_nodes(tmp_path: Path) -> None:
    spec = tmp_path / "llama.yaml"
    shutil.copy(EXAMPLES / "llama-70b.yaml", spec)
    err = expect_config_error(lambda: load_job(spec, ["nodes=3"]), tmp_path)
    problem = assert_names(err, "nodes", 3, "not a multiple of tp*cp*pp = 32", line=None)
    assert problem.note == "from --set"


def test_config_error_problem_fields(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, nodes=-2)
    err = expect_config_error(lambda: load_spec(spec), tmp_path)
    assert isinstance(err, ConfigError)
    (problem,) = err.problems
    assert (problem.path, problem.value, problem.line) == ("nodes", -2, line_of(spec, "nodes:"))
    assert "greater than 0" in problem.allowed
    assert str(err) == f"invalid job spec {spec}: nodes (line {problem.line}): got -2; expected a number greater than 0"


def test_gpus_left_idle_on_whole_nodes_are_warned_of_and_too_many_refused(tmp_path: Path) -> None:
    """gpus_per_node below the node type's count wastes the rest of each exclusive node: said in plan (and submit);
    above it, refused. A site whose emulated GPUs share nodes (oversubscribe) wastes nothing."""
    idle = load_job(write_spec(tmp_path, site="dgx-h100", nodes=2, gpus_per_node=3)).plan.warnings
    assert idle == ["gpus_per_node 3 leaves 5 of each node's 8 GPUs idle for the whole job (its nodes are allocated"
                    " whole): use gpus_per_node 8, or fewer nodes"]
    assert load_job(write_spec(tmp_path, site="dgx-h100", nodes=2, gpus_per_node=8)).plan.warnings == []
    assert load_job(write_spec(tmp_path, site="local", nodes=2, gpus_per_node=3)).plan.warnings == []
    with pytest.raises(ConfigError, match="gpus_per_node .*expected at most 8"):
        load_job(write_spec(tmp_path, site="dgx-h100", nodes=2, gpus_per_node=9))
