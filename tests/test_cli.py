"""The command line as a user meets it: `plan`, `plan --json`, `site validate`, `schema`, exit codes."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import (
    EXAMPLE_FILES,
    EXAMPLES,
    MINIMAL_SPEC,
    REPO,
    cli,
    expect_cli_config_error,
    minimal_site,
    snapshot,
    write_spec,
    write_yaml,
)

from clusterctl.config.site import shipped_sites

LLAMA = EXAMPLES / "llama-70b.yaml"
QUICKSTART = EXAMPLES / "quickstart.yaml"


def table_rows(text: str) -> list[list[str]]:
    """Cells of every table row rich drew with vertical bars."""
    return [[cell.strip() for cell in line.strip().strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


def ok(*args: Any) -> str:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return result.stdout


# --- plan, as tables -------------------------------------------------------------------


def test_plan_llama_70b_tables() -> None:
    out = ok("plan", LLAMA, "--site", "dgx-h100")
    assert "Plan for llama-70b" in out
    assert "16 x 8 GPUs = world size 128" in out
    assert "tp 8 x cp 1 x dp 4 x pp 4; vpp 5" in out
    assert "memory verdict: FITS" in out and "DOES NOT FIT" not in out
    rows = table_rows(out)
    # Rank map: block distribution, first and last nodes shown, the middle elided.
    assert ["0", *map(str, range(8))] in rows
    assert ["3", *map(str, range(24, 32))] in rows
    assert ["15", *map(str, range(120, 128))] in rows
    assert ["... 11 more", *["..."] * 8] in rows
    # Group tables: kinds with more than one rank, once each (tp_cp = tp and dp_cp = dp here).
    groups = {row[0]: row[1:] for row in rows if "(" in row[0] and row[0].split(" ")[0] in {"tp", "cp", "dp", "pp", "tp_cp", "dp_cp", "mp", "ep"}}
    assert groups == {
        "tp (tensor)": ["8", "16", "0/16", "[0, 1, 2, 3, ..., 7]"],
        "dp (data)": ["4", "32", "32/32", "[0, 8, 16, 24]"],
        "pp (pipeline)": ["4", "32", "32/32", "[0, 32, 64, 96]"],
        "mp (tensor x pipeline)": ["32", "4", "4/4", "[0, 1, 2, 3, ..., 103]"],
    }
    assert "1 micro x 128 accum x 4 dp = 512 sequences" in out
    assert "3/(5*128+3)" in out
    assert "0-7 (one each)" in out  # every dp group stays on one rail


def test_plan_quickstart_on_the_local_site() -> None:
    out = ok("plan", QUICKSTART)
    assert "site       │ local, partition local" in out
    assert "2 x 2 GPUs = world size 4" in out
    assert "memory verdict: FITS" in out
    assert ["1", "2", "3"] in table_rows(out)


def test_plan_does_not_fit() -> None:
    # Valid (tp 1 fits any NVLink domain, no pipeline) but 70B parameters per GPU.
    args = ["plan", LLAMA, "--set", "parallel.tp=1", "--set", "parallel.pp=1", "--set", "parallel.vpp=1"]
    out = ok(*args)
    assert "memory verdict: DOES NOT FIT" in out
    assert "verdict: FITS" not in out
    assert "warning: the memory estimate does not fit the GPU" in out
    plan = json.loads(ok(*args, "--json"))
    assert (plan["parallel"]["tp"], plan["parallel"]["pp"], plan["parallel"]["dp"]) == (1, 1, 128)
    assert plan["memory"]["fits"] is False
    assert plan["memory"]["headroom"] < 0


def test_plan_errors_print_no_partial_output(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, site="dgx-h100", nodes=2, parallel={"tp": 16})
    expect_cli_config_error(["plan", spec, "--json"], tmp_path, "parallel.tp (line", "NVLink domain")
    expect_cli_config_error(["plan", spec], tmp_path, "parallel.tp (line", "NVLink domain")


# --- plan --json --------------------------------------------------------------------------


def reference_groups(sizes: dict[str, int], axes: set[str]) -> list[list[int]]:
    """Ranks that differ only along `axes`; sizes are in rank order, the first axis fastest."""
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for rank in range(math.prod(sizes.values())):
        coords, rest = {}, rank
        for axis, size in sizes.items():
            coords[axis], rest = rest % size, rest // size
        groups[tuple(coords[a] for a in sizes if a not in axes)].append(rank)
    return sorted(groups.values())


# Llama-3-70B (examples/llama-70b.yaml) by hand.
L, H, HEADS, KV, FFN, VOCAB = 80, 8192, 64, 8, 28672, 128256
TP, PP, DP, VPP, MICRO, GLOBAL, SEQ = 8, 4, 4, 5, 1, 512, 8192
ACCUM = GLOBAL // (MICRO * DP)  # 128
PER_LAYER = (2 * H * H + 2 * H * KV * (H // HEADS)) + 3 * H * FFN + 2 * H  # attention + SwiGLU MLP + 2 norms
TOTAL_PARAMS = L * PER_LAYER + 2 * VOCAB * H + H  # untied embeddings + final norm
PER_GPU = TOTAL_PARAMS // (TP * PP)
PARAM_BYTES = 2 * PER_GPU  # bf16 weights
GRAD_BYTES = 2 * PER_GPU  # bf16 gradients
OPTIMIZER_BYTES = 12 * PER_GPU // DP  # fp32 master + Adam m, v; zero1 shards them over dp*cp = 4
ACTIVATION_BYTES = 34 * SEQ * MICRO * H // TP * (L // PP) * min(PP, ACCUM)  # selective recompute, 1F1B
CAPACITY = 80 * 10**9


def test_plan_json_llama_70b() -> None:
    plan = json.loads(ok("plan", LLAMA, "--site", "dgx-h100", "--json"))
    assert plan["world_size"] == 128
    assert (plan["nodes"], plan["gpus_per_node"]) == (16, 8)
    assert (plan["micro_batch"], plan["grad_accum"], plan["global_batch"]) == (MICRO, ACCUM, GLOBAL)
    assert plan["parallel"] == {"tp": 8, "pp": 4, "dp": 4, "cp": 1, "ep": 1, "vpp": 5, "edp": 4}
    assert plan["bubble_fraction"] == pytest.approx(3 / 643, rel=1e-12)  # (pp-1)/(vpp*accum+pp-1)
    assert plan["tokens_per_step"] == GLOBAL * SEQ

    assert plan["rank_map"] == [{"rank": r, "node": r // 8, "gpu": r % 8} for r in range(128)]

    decoder = {"tp": TP, "cp": 1, "dp": DP, "pp": PP}
    expert = {"tp": TP, "ep": 1, "edp": DP, "pp": PP}
    expected = {
        "tp": reference_groups(decoder, {"tp"}),
        "cp": reference_groups(decoder, {"cp"}),
        "dp": reference_groups(decoder, {"dp"}),
        "pp": reference_groups(decoder, {"pp"}),
        "tp_cp": reference_groups(decoder, {"tp", "cp"}),
        "dp_cp": reference_groups(decoder, {"dp", "cp"}),
        "mp": reference_groups(decoder, {"tp", "pp"}),
        "ep": reference_groups(expert, {"ep"}),
    }
    for kind, groups in expected.items():
        assert plan["groups"][kind] == groups, kind
    assert plan["groups"]["tp"][1] == list(range(8, 16))
    assert plan["groups"]["dp"][0] == [0, 8, 16, 24]
    assert plan["groups"]["pp"][0] == [0, 32, 64, 96]
    assert plan["groups"]["mp"][0] == [*range(0, 8), *range(32, 40), *range(64, 72), *range(96, 104)]
    assert plan["groups"]["ep"] == [[r] for r in range(128)]

    memory = plan["memory"]
    assert memory["params"] == PARAM_BYTES == 4_409_606_656
    assert memory["grads"] == GRAD_BYTES
    assert memory["optimizer"] == OPTIMIZER_BYTES == 6_614_409_984
    assert memory["activations"] == ACTIVATION_BYTES == 22_817_013_760
    total = PARAM_BYTES + GRAD_BYTES + OPTIMIZER_BYTES + ACTIVATION_BYTES
    assert memory["total"] == total
    assert memory["capacity"] == CAPACITY
    assert memory["headroom"] == CAPACITY - total == 41_749_362_944
    assert memory["params_per_gpu"] == PER_GPU == 70_553_706_496 // 32  # Llama-3-70B: 70.6B parameters
    assert memory["fits"] is True


def test_plan_json_is_one_line_on_stdout() -> None:
    result = cli("plan", QUICKSTART, "--json")
    assert result.exit_code == 0 and result.stderr == ""
    assert result.stdout.count("\n") == 1
    assert json.loads(result.stdout)["world_size"] == 4


# --- site validate -------------------------------------------------------------------------


def test_site_validate_ok_by_name_and_path(tmp_path: Path) -> None:
    out = ok("site", "validate", "dgx-h100")
    assert out.startswith(f"ok: site dgx-h100 ({shipped_sites()['dgx-h100']}): 2 partition(s), 1 node type(s), 8 GPU slot(s)")
    path = write_yaml(tmp_path, minimal_site(), "mini.yaml")
    assert ok("site", "validate", path).startswith(f"ok: site mini ({path})")


def test_site_validate_failing(tmp_path: Path) -> None:
    data = minimal_site()
    data["node_types"]["box"]["gpus"][1]["cpus"] = "3-7"
    path = write_yaml(tmp_path, data, "bad.yaml")
    expect_cli_config_error(
        ["site", "validate", path],
        tmp_path,
        f"invalid site config {path}: node_types.box.gpus[1].cpus (line ",
        "got '3-7'; CPU 3 is also bound to GPU 0",
    )


# --- schema --------------------------------------------------------------------------------


def schema_validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(ok("schema"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_schema_prints_the_job_spec_schema() -> None:
    schema = json.loads(ok("schema"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["type"] == "object"
    assert set(schema["required"]) == {"name", "time_limit"}
    assert schema["additionalProperties"] is False
    assert {"checkpoint", "batch", "parallel", "signal", "env", "command"} <= set(schema["properties"])
    assert set(schema["$defs"]["Checkpoint"]["properties"]) == {"dir", "interval", "keep", "async", "save_seconds", "mtbf",
                                                                 "memory_interval"}
    assert "global" in schema["$defs"]["Batch"]["properties"]


def test_schema_is_valid_json_schema_2020_12() -> None:
    assert type(schema_validator()).__name__ == "Draft202012Validator"


def test_schema_accepts_a_spec_in_long_form() -> None:
    spec = {
        **MINIMAL_SPEC,
        "site": "dgx-h100",
        "nodes": 2,
        "parallel": {"tp": 8},
        "batch": {"micro": 1, "global": 64},
        "precision": {"compute": "bf16"},
        "preflight": {"checks": ["gpu", "comm"]},
        "checkpoint": {"async": True, "interval": "auto"},
        "model": {"params": "7B"},
        "env": {"A": 1, "B": True, "C": "x"},
        "command": ["python", "train.py"],
    }
    assert list(schema_validator().iter_errors(spec)) == []


@pytest.mark.parametrize(
    "spec",
    [
        {"time_limit": "1h"},
        {**MINIMAL_SPEC, "name": "my job"},
        {**MINIMAL_SPEC, "parallel": {"tpp": 2}},
        {**MINIMAL_SPEC, "optimizer": "lamb"},
        {**MINIMAL_SPEC, "nodes": 0},
    ],
    ids=["no-name", "bad-name", "unknown-key", "bad-enum", "zero-nodes"],
)
def test_schema_rejects_what_the_loader_rejects(spec: dict[str, Any]) -> None:
    assert list(schema_validator().iter_errors(spec)) != []


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_schema_accepts_every_example(example: Path) -> None:
    data = yaml.safe_load(example.read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in schema_validator().iter_errors(data)]
    assert errors == []


# --- bad input and usage -------------------------------------------------------------------


def test_bad_spec_exits_65_with_one_message(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, nodes="two")
    stderr = expect_cli_config_error(["plan", spec], tmp_path, f"error: invalid job spec {spec}: nodes (line 3): got 'two'")
    assert stderr.count("\n") == 1


def test_several_problems_are_listed_one_per_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, nodes=0, optimizer="lamb")
    stderr = expect_cli_config_error(["plan", spec], tmp_path, "2 problems")
    assert [line for line in stderr.splitlines() if line.startswith("  - ")] == [
        "  - nodes (line 3): got 0; expected a number greater than 0",
        "  - optimizer (line 4): got 'lamb'; expected one of adam, adamw, sgd",
    ]


def test_malformed_set_exits_65(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    expect_cli_config_error(["plan", spec, "--set", "parallel.tp"], tmp_path, "--set: got 'parallel.tp'; expected FIELD.PATH=VALUE")


def test_missing_spec_file_exits_65(tmp_path: Path) -> None:
    expect_cli_config_error(["plan", tmp_path / "nope.yaml"], tmp_path, "nope.yaml: no such file")


@pytest.mark.parametrize(
    "args",
    [["nonexistent"], ["plan"], ["plan", "x.yaml", "--bogus"], ["site", "frobnicate"]],
    ids=["unknown-command", "missing-argument", "unknown-option", "unknown-subcommand"],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    before = snapshot(tmp_path)
    result = cli(*args, cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert "Usage:" in result.stderr
    assert "Traceback" not in result.output
    assert snapshot(tmp_path) == before


def test_error_text_is_not_read_as_markup(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, rendezvous={"port_range": [100, 200]})
    expect_cli_config_error(["plan", spec], tmp_path, "expected [low, high] with 1024 <= low <= high <= 65535")


def test_bad_value_is_shown_as_given(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x[red]y")
    expect_cli_config_error(["plan", spec], tmp_path, "got 'x[red]y'")


def test_bad_value_with_a_closing_tag_is_reported(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="a[/x]b")
    expect_cli_config_error(["plan", spec], tmp_path, "got 'a[/x]b'")


def test_bad_partition_max_time_fails_as_a_config_error(tmp_path: Path) -> None:
    data = minimal_site()
    data["partitions"]["gpu"]["max_time"] = "forever"
    write_yaml(tmp_path, data, "site.yaml")
    spec = write_spec(tmp_path, site="site.yaml", nodes=1)
    expect_cli_config_error(["plan", spec], tmp_path, "max_time")


# --- the installed console script ----------------------------------------------------------


def console_script() -> str:
    script = Path(sys.executable).with_name("clusterctl")
    found = str(script) if script.exists() else shutil.which("clusterctl")
    assert found, "the clusterctl console script is not installed next to this interpreter nor on PATH"
    return found


def test_console_script_plans_the_quickstart() -> None:
    done = subprocess.run(
        [console_script(), "plan", "examples/quickstart.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    assert "2 x 2 GPUs = world size 4" in done.stdout
    assert "memory verdict: FITS" in done.stdout
    assert done.stderr == ""


def test_console_script_exit_code_for_a_bad_spec(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, nodes=0)
    done = subprocess.run(
        [console_script(), "plan", str(spec)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 65
    assert done.stdout == ""
    assert done.stderr == f"error: invalid job spec {spec}: nodes (line 3): got 0; expected a number greater than 0\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]
