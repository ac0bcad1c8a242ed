"""Bad input as a careless user or a hostile paste brings it: exit 65 naming the field, never a traceback, no debris.

Every case runs the real command line in-process (`plan`, `render -o`,
`submit --dry-run`) in a scratch working directory and checks the three
promises: the exit code is 65 (never 1, an internal error), the one error
line names the field and what is allowed, and nothing was written.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import EXAMPLES, cli, expect_cli_config_error, snapshot, write_yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

QUICKSTART = (EXAMPLES / "quickstart.yaml").read_text(encoding="utf-8")


def quickstart(**changes: Any) -> dict[str, Any]:
    data = yaml.safe_load(QUICKSTART)
    data.update(changes)
    return data


def dry_run(root: Path, spec: Path, *extra: str) -> list[Any]:
    return ["submit", spec, "--dry-run", "--set", f"runs_root={root / 'runs'}", *extra]


# --- 1. characters YAML cannot carry -------------------------------------------


@pytest.mark.parametrize(
    "char, name", [("\x00", "U+0000 (NUL)"), ("\x1b", "U+001B (ESC)"), ("\x01", "U+0001"), ("\x7f", "U+007F (DEL)")]
)
@pytest.mark.parametrize("where", ["comment", "value", "key"])
def test_control_character_anywhere_is_named_with_line_and_column(
    tmp_path: Path, char: str, name: str, where: str
) -> None:
    lines = QUICKSTART.splitlines()
    target = next(i for i, line in enumerate(lines) if line.startswith("seq_len:"))
    if where == "comment":
        lines[0] = lines[0] + " note" + char
        line, column = 1, len(lines[0])
    elif where == "value":
        lines[target] = "seq_len: 6" + char + "4"
        line, column = target + 1, len("seq_len: 6") + 1
    else:
        lines[target] = "seq" + char + "_len: 64"
        line, column = target + 1, 4
    spec = tmp_path / "job.yaml"
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for args in (["plan", spec], dry_run(tmp_path, spec), ["render", spec, "-o", tmp_path / "out"]):
        err = expect_cli_config_error(args, tmp_path, f"line {line}: column {column}", name, "remove it")
        assert "internal error" not in err


def test_control_character_in_a_site_file(tmp_path: Path) -> None:
    site = (Path(__file__).resolve().parents[1] / "site-configs" / "local.yaml").read_text()
    path = tmp_path / "site.yaml"
    path.write_text("\x1b[1m" + site, encoding="utf-8")
    expect_cli_config_error(["site", "validate", path], tmp_path, "line 1: column 1", "ESC")


# --- 1. nesting -------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 1_000, 30_000])
@pytest.mark.parametrize("style", ["flow-list", "flow-map", "block"])
def test_deep_nesting_is_refused(tmp_path: Path, depth: int, style: str) -> None:
    if style == "flow-list":
        value = "[" * depth + "]" * depth
    elif style == "flow-map":
        value = "{a: " * depth + "1" + "}" * depth
    else:
        value = "".join("\n" + "  " * (i + 1) + "a:" for i in range(min(depth, 2_000))) + " 1"
    spec = tmp_path / "job.yaml"
    spec.write_text(QUICKSTART + f"env: {value}\n", encoding="utf-8")
    expect_cli_config_error(["plan", spec], tmp_path, "nested more than 64 levels deep")


def test_deep_nesting_from_the_command_line(tmp_path: Path) -> None:
    spec = write_yaml(tmp_path, quickstart())
    expect_cli_config_error(["plan", spec, "--set", "env=" + "[" * 20_000], tmp_path, "--set", "nested at most 64")


def test_nesting_a_spec_needs_is_read(tmp_path: Path) -> None:
    spec = write_yaml(tmp_path, quickstart(env={"A": "1"}))
    assert cli("plan", spec).exit_code == 0


# --- 1. absurd sizes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "override, needles",
    [
        ("nodes=100000000", ["nodes: got 100000000", "partition local has 4 nodes; the job needs 100000000"]),
        ("nodes=1e30", ["nodes: got '1e30'", "expected a whole number"]),
        ("parallel.dp=1e18", ["parallel.dp: got '1e18'", "expected a whole number"]),
        ("parallel.dp=1000000000000000000", ["nodes", "500000000000000000 nodes"]),
        ("spares=100000000", ["partition local has 4 nodes; the job needs 2 + 100000000 spares"]),
    ],
)
def test_impossible_size_is_refused_before_planning(tmp_path: Path, override: str, needles: list[str]) -> None:
    spec = write_yaml(tmp_path, quickstart())
    expect_cli_config_error(["plan", spec, "--set", override], tmp_path, *needles)


def test_a_huge_world_without_nodes_is_refused_by_the_partition(tmp_path: Path) -> None:
    data = quickstart()
    del data["nodes"]
    spec = write_yaml(tmp_path, data)
    expect_cli_config_error(
        ["plan", spec, "--set", "parallel.pp=100000000"], tmp_path, "partition local has 4 nodes; the job needs 50000000"
    )


def test_a_world_beyond_any_cluster_is_refused_where_the_partition_lists_no_nodes(tmp_path: Path) -> None:
    site = yaml.safe_load((Path(__file__).resolve().parents[1] / "site-configs" / "local.yaml").read_text())
    for part in site["partitions"].values():
        part.pop("nodes", None)
    site_path = write_yaml(tmp_path, site, "site.yaml")
    spec = write_yaml(tmp_path, quickstart(site=str(site_path)))
    expect_cli_config_error(
        ["plan", spec, "--set", "nodes=100000000"], tmp_path, "200000000 ranks", "expected at most 1048576 ranks"
    )


# --- 2. values that would change on the way to the rank ------------------------------


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"command": ["python", "train\x00.py"]}, "command[1]"),
        ({"command": "python train\x00.py --lr 1"}, "command[1]"),
        ({"container": {"image": "nvcr.io#nvidia/pytorch\x00:24.01"}}, "container.image"),
        ({"container": {"image": "a", "mounts": ["/data\x00:/data"]}}, "container.mounts[0]"),
        ({"checkpoint": {"dir": "/shared/ckpt\x00x"}}, "checkpoint.dir"),
        ({"checkpoint": {"dir": "/shared/ckpt\nx"}}, "checkpoint.dir"),
        ({"runs_root": "runs\x00x"}, "runs_root"),
        ({"env": {"A": "x\x00y"}}, "env.A"),
        ({"container": {"image": "a", "env": {"B": "x\x00y"}}}, "container.env.B"),
        ({"container": {"image": "a", "env": {"B;rm": "x"}}}, "container.env"),
    ],
)
def test_nul_in_a_field_that_reaches_a_script_is_refused_at_load(
    tmp_path: Path, changes: dict[str, Any], field: str
) -> None:
    # JSON is YAML: the escapes reach the loader as the characters a careless paste carries.
    import json

    spec = write_yaml(tmp_path, json.dumps(quickstart(**changes)))
    for args in (["plan", spec], ["submit", spec, "--dry-run"], ["render", spec, "-o", tmp_path / "out"]):
        expect_cli_config_error(args, tmp_path, field)


def test_an_empty_container_image_is_refused(tmp_path: Path) -> None:
    spec = write_yaml(tmp_path, quickstart(container={"image": ""}))
    expect_cli_config_error(["plan", spec], tmp_path, "container.image", "omit the field to run without a container")


# --- 3. debris ------------------------------------------------------------------------


def test_a_refused_render_leaves_no_output_directory(tmp_path: Path) -> None:
    spec = write_yaml(tmp_path, quickstart(command=None))
    out = tmp_path / "deep" / "out"
    expect_cli_config_error(["render", spec, "-o", out], tmp_path, "command")
    assert not (tmp_path / "deep").exists()


@pytest.mark.parametrize("root", ["my runs", "runs;rm -rf x", "runs/$(id)", "a\tb/c"])
def test_a_refused_runs_root_leaves_no_directories(tmp_path: Path, root: str) -> None:
    spec = write_yaml(tmp_path, quickstart(runs_root=root))
    expect_cli_config_error(["submit", spec, "--dry-run"], tmp_path, "runs_root")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


def test_runs_root_with_an_unset_variable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLUSTERCTL_TEST_UNSET", raising=False)
    spec = write_yaml(tmp_path, quickstart(runs_root="$CLUSTERCTL_TEST_UNSET/runs"))
    expect_cli_config_error(
        ["submit", spec, "--dry-run"], tmp_path, "runs_root", "CLUSTERCTL_TEST_UNSET is not set"
    )


def test_runs_root_expands_variables_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_TEST_SCRATCH", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()  # the file system; the runs root in it is created
    spec = write_yaml(tmp_path, quickstart(runs_root="${CLUSTERCTL_TEST_SCRATCH}/runs"))
    result = cli("submit", spec, "--dry-run", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    runs = list((tmp_path / "scratch" / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "job.sbatch").is_file()


# --- 5. checks that come too late ------------------------------------------------------


def test_excluding_a_node_the_partition_lacks_is_refused_at_plan_time(tmp_path: Path) -> None:
    spec = write_yaml(tmp_path, quickstart(topology={"exclude": ["node9"]}))
    expect_cli_config_error(["plan", spec], tmp_path, "topology.exclude", "node9 is not among partition local's nodes")


def test_excluding_too_many_nodes_is_refused(tmp_path: Path) -> None:
    spec = write_yaml(tmp_path, quickstart(topology={"exclude": ["node[1-3]"]}))
    expect_cli_config_error(["plan", spec], tmp_path, "partition local has 4 nodes, 3 of them excluded")


# --- fuzz: random bytes, nesting and sizes into the loader and the planner ---------------

# About 20 s in all at the default; CLUSTERCTL_FUZZ_EXAMPLES raises it for a longer hunt.
FUZZ = settings(
    max_examples=int(os.environ.get("CLUSTERCTL_FUZZ_EXAMPLES", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _outcome(text: bytes | str, *overrides: str) -> None:
    """Plan and dry-run one spec: exit 0 or 65, never 1, no traceback; a refusal writes nothing."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        spec = root / "job.yaml"
        if isinstance(text, bytes):
            spec.write_bytes(text)
        else:
            spec.write_text(text, encoding="utf-8")
        sets = [a for o in overrides for a in ("--set", o)]
        before = snapshot(root)
        result = cli("submit", spec, "--dry-run", "--set", f"runs_root={root / 'runs'}", *sets, cwd=root)
        assert result.exit_code in (0, 65), result.output
        assert "Traceback" not in result.output and "internal error" not in result.output
        if result.exit_code == 65:
            assert result.stderr.startswith("error: invalid "), result.stderr
            assert snapshot(root) == before


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(data: bytes) -> None:
    _outcome(data)


@FUZZ
@given(st.data())
def test_fuzz_mutated_quickstart(data: st.DataObject) -> None:
    raw = bytearray(QUICKSTART.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw)))
        op = data.draw(st.sampled_from(["insert", "replace", "delete"]))
        byte = data.draw(st.integers(0, 255))
        if op == "insert":
            raw[pos:pos] = bytes([byte])
        elif op == "replace" and pos < len(raw):
            raw[pos] = byte
        elif pos < len(raw):
            del raw[pos]
    _outcome(bytes(raw))


@FUZZ
@given(st.integers(1, 5_000), st.sampled_from(["[", "{a: ", "- "]))
def test_fuzz_nesting_depth(depth: int, opener: str) -> None:
    closer = {"[": "]", "{a: ": "}", "- ": ""}[opener]
    value = opener * depth + ("1" if opener != "[" else "") + closer * depth
    _outcome(QUICKSTART + f"env: {value}\n")


_SIZE = st.one_of(
    st.integers(-3, 10), st.integers(0, 2**70), st.floats(allow_nan=True), st.sampled_from(["1e18", "1e30", "-1", "0x10"])
)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            ["nodes", "gpus_per_node", "spares", "parallel.tp", "parallel.pp", "parallel.dp", "parallel.cp",
             "parallel.ep", "parallel.vpp", "batch.micro", "batch.global", "batch.grad_accum", "seq_len"]
        ),
        _SIZE,
        max_size=4,
    )
)
def test_fuzz_sizes(sizes: dict[str, Any]) -> None:
    _outcome(QUICKSTART, *(f"{k}={v}" for k, v in sizes.items()))


def test_fuzz_corpus_of_real_pastes() -> None:
    """Pastes seen in the wild: a Windows file, a BOM, tabs, smart quotes, a stray terminal sequence."""
    samples = [
        QUICKSTART.replace("\n", "\r\n"),
        "\ufeff" + QUICKSTART,
        QUICKSTART.replace("  ", "\t"),
        QUICKSTART.replace('"300"', "\u201c300\u201d"),
        QUICKSTART + "\x1b[0m\n",
        QUICKSTART.replace("nodes: 2", "nodes: 2\u00a0"),
        QUICKSTART[: len(QUICKSTART) // 2],
    ]
    for text in samples:
        _outcome(text)


def test_a_key_with_a_bracket_typed_in_is_named() -> None:
    """Found by the fuzz run: `o[ptimizer: adamw` crashed the error formatter (it took the key for a pydantic tag)."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        spec = write_yaml(root, QUICKSTART.replace("optimizer: adamw", "o[ptimizer: adamw"))
        expect_cli_config_error(["plan", spec], root, "o[ptimizer", "unknown key", "did you mean 'optimizer'?")
