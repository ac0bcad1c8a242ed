"""Hostlist expansion and compression, checked against Slurm's own `scontrol`.

The tables hold the expected output of `scontrol show hostnames` /
`scontrol show hostlist` (Slurm 22.05), so they run without Slurm; the same
tables, and randomly generated expressions, are also compared with the real
thing. `scontrol` needs no cluster for these two commands, only a slurm.conf
naming a cluster and a controller host. `make test` installs it first (the
sysdeps target runs the test cluster's install step); where it is missing,
the comparisons install it the same way when they run as root, are skipped
otherwise, and fail when CI is set.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import timeit
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.syntax.hostlist import MAX_HOSTS, HostlistError, compress, expand, first

LAB_SH = Path(__file__).resolve().parent / "slurmlab" / "lab.sh"
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Scontrol:
    """Runs `scontrol show hostnames|hostlist`, many expressions per process.

    Without a terminal, scontrol reads commands from stdin and echoes each one
    as `scontrol: <command>` before its output, which delimits the answers.
    Invalid input only prints `Invalid hostlist: EXPR` to stderr (exit code 0).
    Lines are split on whitespace, so expressions with whitespace go through
    argv, one process each.
    """

    def __init__(self, exe: str, conf: Path) -> None:
        self.exe = exe
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["SLURM_CONF"] = str(conf)
        # scontrol reads stdin through readline, which echoes each command;
        # keep that echo free of cursor movement and line wrapping.
        self.env.update(TERM="dumb", COLUMNS="1000000", INPUTRC="/dev/null")

    def _run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.exe, *args], input=stdin, capture_output=True, text=True, env=self.env, timeout=60
        )

    def _batch(self, command: str, exprs: list[str]) -> dict[str, list[str] | None]:
        proc = self._run([], "".join(f"show {command} {e}\n" for e in exprs))
        invalid = {
            line.removeprefix("Invalid hostlist: ")
            for line in proc.stderr.splitlines()
            if line.startswith("Invalid hostlist: ")
        }
        out: dict[str, list[str] | None] = {}
        current: list[str] | None = None
        pending = iter(exprs)
        expected = next(pending, None)
        for line in proc.stdout.split("\n"):
            if expected is not None and line == f"scontrol: show {command} {expected}":
                current = out.setdefault(expected, [])
                expected = next(pending, None)
            elif line.startswith("scontrol: "):
                current = None  # the prompt scontrol prints at end of input
            elif current is not None and line:
                current.append(line)
        assert expected is None, f"lost track at {expected!r}:\n{proc.stdout[-2000:]}"
        return {e: None if e in invalid else out[e] for e in exprs}

    def hostnames(self, exprs: list[str]) -> dict[str, list[str] | None]:
        """Map each expression to scontrol's host names, or None where it says invalid."""
        exprs = list(dict.fromkeys(exprs))
        result = self._batch("hostnames", [e for e in exprs if e and not _has_space(e)])
        for e in exprs:
            if not e or _has_space(e):
                proc = self._run(["--", "show", "hostnames", e])
                result[e] = None if "Invalid hostlist" in proc.stderr else proc.stdout.split()
        return result

    def hostlist(self, name_lists: list[list[str]]) -> list[str]:
        """scontrol's compressed form of each non-empty list of plain host names."""
        exprs = [",".join(names) for names in name_lists]
        result = self._batch("hostlist", list(dict.fromkeys(exprs)))
        return [" ".join(result[e] or ["<invalid>"]) for e in exprs]

    def version(self) -> str:
        return self._run(["--version"]).stdout.strip()


def _has_space(text: str) -> bool:
    return any(c.isspace() for c in text)


def _unavailable(reason: str) -> NoReturn:
    """Skip the comparison with Slurm; fail instead when CI is set, where it must run."""
    if os.environ.get("CI"):
        pytest.fail(f"cannot compare with Slurm's scontrol (CI is set): {reason}", pytrace=False)
    pytest.skip(reason)


def _find_scontrol() -> str | None:
    """scontrol on PATH; as root, after the test cluster's install step (idempotent) where it is missing."""
    found = shutil.which("scontrol")
    if found is None and os.geteuid() == 0 and LAB_SH.is_file():
        try:
            subprocess.run(["bash", str(LAB_SH), "install"], stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=900, check=False)
        except subprocess.TimeoutExpired:
            pass
        found = shutil.which("scontrol")
    return found


@pytest.fixture(scope="session")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> Scontrol:
    exe = _find_scontrol()
    if exe is None:
        _unavailable(f"scontrol (Slurm client) is not on PATH and `{LAB_SH} install` did not provide it"
                     " (make sysdeps installs it; it needs root)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    # The minimum scontrol needs to start: without ClusterName or
    # SlurmctldHost it refuses; no node, partition or daemon is needed.
    conf.write_text("ClusterName=clusterctl-test\nSlurmctldHost=localhost\n")
    sc = Scontrol(exe, conf)
    probe = sc._run(["show", "hostnames", "n[1-2]"])
    if probe.stdout.split() != ["n1", "n2"]:
        _unavailable(f"scontrol does not run with a minimal slurm.conf: {probe.stderr.strip()}")
    return sc


def _n(prefix: str, numbers: range, width: int = 0) -> list[str]:
    return [f"{prefix}{i:0{width}d}" for i in numbers]


# expression -> what `scontrol show hostnames` prints (Slurm 22.05)
EXPAND_CASES: list[tuple[str, list[str]]] = [
    ("n1", ["n1"]),
    ("gpu-[001-004,010]", ["gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-010"]),
    ("linux[1,2]", ["linux1", "linux2"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    # zero padding follows the width of the lower bound as written
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("n[09-11]", ["n09", "n10", "n11"]),
    ("n[1-010]", _n("n", range(1, 11))),
    ("n[009-11]", ["n009", "n010", "n011"]),
    ("n[001-3]", ["n001", "n002", "n003"]),
    ("n[00]", ["n00"]),
    ("n[0-0]", ["n0"]),
    ("n[5]", ["n5"]),
    ("n[01-2]x[1]", ["n01x1", "n02x1"]),
    # order and duplicates are kept
    ("n[3,1-2]", ["n3", "n1", "n2"]),
    ("n[1-2,2-3]", ["n1", "n2", "n2", "n3"]),
    ("a,a,b,a", ["a", "a", "b", "a"]),
    ("n5,n[1-3],n5", ["n5", "n1", "n2", "n3", "n5"]),
    # several bracket groups: the last varies fastest, then the first, ...
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("[1-2]x[3-4]", ["1x3", "1x4", "2x3", "2x4"]),
    ("a[1,3]-[5-6]", ["a1-5", "a1-6", "a3-5", "a3-6"]),
    ("n[1]-[2]", ["n1-2"]),
    (
        "a[1-2]b[3-4]c[5-6]",
        ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"],
    ),
    (
        "a[1-2]b[3-4]c[5-6]d[7-8]",
        [f"a{a}b{b}c{c}d{d}" for c in (5, 6) for b in (3, 4) for a in (1, 2) for d in (7, 8)],
    ),
    # dashes, unnumbered names and mixed lists (bugs other launchers had)
    ("alpha-gpu-[01-02]", ["alpha-gpu-01", "alpha-gpu-02"]),
    ("node-1-[3-4]", ["node-1-3", "node-1-4"]),
    ("a-1-b", ["a-1-b"]),
    ("1-2", ["1-2"]),
    ("worker", ["worker"]),
    ("login,worker", ["login", "worker"]),
    ("host-a,host-b[1-2],host-c", ["host-a", "host-b1", "host-b2", "host-c"]),
    ("gpu1,gpu[3-4],cpu-a", ["gpu1", "gpu3", "gpu4", "cpu-a"]),
    ("queue1-st-p4d24xlarge-[1-2]", ["queue1-st-p4d24xlarge-1", "queue1-st-p4d24xlarge-2"]),
    ("nid[00001-00003,00010]", ["nid00001", "nid00002", "nid00003", "nid00010"]),
    ("n01,n[02-03]", ["n01", "n02", "n03"]),
    ("[1-3]", ["1", "2", "3"]),
    ("n#1,a%d[1-2],-a1", ["n#1", "a%d1", "a%d2", "-a1"]),
    # separators: commas, spaces and tabs; empty items vanish
    ("n[1-2],", ["n1", "n2"]),
    (",n1", ["n1"]),
    ("a,,b", ["a", "b"]),
    (" a , b ", ["a", "b"]),
    ("a b", ["a", "b"]),
    ("a\tb", ["a", "b"]),
    ("n[1-2] m", ["n1", "n2", "m"]),
    ("", []),
    (",", []),
    ("  ", []),
    ("n[0-65535]", _n("n", range(65536))),
    ("gpu-[00001-12800]", _n("gpu-", range(1, 12801), 5)),
]

# expression -> part of our error message; scontrol rejects all of these too
ERROR_CASES: list[tuple[str, str]] = [
    ("n[3-1]", "descending range '3-1'"),
    ("a[3-1]b[1-2]", "descending range '3-1'"),
    ("n[]", "empty brackets"),
    ("a[]b[1]", "empty brackets"),
    ("n[1,,2]", "empty element"),
    ("n[,1]", "empty element"),
    ("n[1-2,]", "empty element"),
    ("n[a-b]", "'a-b' is not a number"),
    ("n[0x1-3]", "'0x1-3' is not a number"),
    ("n[1x2]", "'1x2' is not a number"),
    ("n[\u0663]", "is not a number"),  # an Arabic-Indic digit
    ("n[1-2-3]", "'1-2-3' is not a number"),
    ("n[1--2]", "'1--2' is not a number"),
    ("n[-2]", "no lower bound"),
    ("n[1-2]x", "text 'x' after the last ']'"),
    ("n[1-2]-x", "text '-x' after the last ']'"),
    ("n1[2]3", "text '3' after the last ']'"),
    ("n[[1]]", "nested '['"),
    ("n[1-2]]", "unmatched ']'"),
]

# Accepted by scontrol 22.05 but only to produce garbage: we raise instead.
# expression -> (part of our error message, what scontrol 22.05 prints)
REJECTED_GARBAGE: list[tuple[str, str, list[str]]] = [
    ("n[1-3", "unclosed '['", ["n]"]),
    ("x,a[1-2,y", "unclosed '['", ["x", "a]", "y"]),
    ("n]", "unmatched ']'", ["n]"]),
    ("a]b[1-2]", "unmatched ']'", ["a]b1", "a]b2"]),
    ("n[[1-2]", "nested '['", ["n[1", "n[2"]),
    ("n[ 1-2]", "whitespace inside brackets", ["n01", "n02"]),
    ("n[1, 2]", "whitespace inside brackets", ["n1", "n02"]),
    ("n[+1-2]", "'+1-2' is not a number", ["n01", "n02"]),
    ("n[1-+2]", "'1-+2' is not a number", ["n1", "n2"]),
    ("n[1a-3]", "'1a-3' is not a number", ["n01", "n02", "n03"]),  # junk after N is skipped
    ("n[1-]", "no upper bound", ["n1"]),
    ("n[18446744073709551616]", "64 bits", ["n18446744073709551615"]),
    # an error in a bracket group other than the last two drops the item silently
    ("n1,a[x]b[1]c[1],n2", "'x' is not a number", ["n1", "n2"]),
    ("a[]b[1]c[1]d[1],z", "empty brackets", ["z"]),
    ("a[1-2]b[3-1]c[1]d[1]", "descending range", []),
]

# names -> what `scontrol show hostlist` prints for them joined by commas
COMPRESS_CASES: list[tuple[list[str], str]] = [
    (["n1", "n2", "n3"], "n[1-3]"),
    (["n3", "n1", "n2"], "n[3,1-2]"),
    (["n1", "n1", "n2"], "n[1,1-2]"),
    (["n1", "n2", "n1"], "n[1-2,1]"),
    (["n1", "n3", "n5"], "n[1,3,5]"),
    (["n10", "n9"], "n[10,9]"),
    (["n01", "n02", "n3"], "n[01-02,3]"),
    (["n1", "n02"], "n[1,02]"),
    (["n9", "n10", "n11"], "n[9-11]"),
    (["n09", "n10", "n11"], "n[09-11]"),
    (["n8", "n09", "n10"], "n[8,09-10]"),
    (["n98", "n099", "n100"], "n[98,099-100]"),
    (["n7", "n8", "n9", "n10", "n011"], "n[7-10,011]"),
    (["n0", "n00", "n000"], "n[0,00,000]"),
    (["n010", "n11"], "n[010,11]"),
    (["a", "b", "c"], "a,b,c"),
    (["b", "a"], "b,a"),
    (["a", "a"], "a,a"),
    (["n1", "x", "n2"], "n1,x,n2"),
    (["x", "n1", "n2"], "x,n[1-2]"),
    (["n1", "m1", "n2"], "n1,m1,n2"),
    (["gpu-001", "gpu-002", "gpu-004", "gpu-010"], "gpu-[001-002,004,010]"),
    (["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"], "rack1-n[01-02],rack2-n[01-02]"),
    (["a1b2", "a1b3"], "a1b[2-3]"),
    (["1", "2", "3"], "[1-3]"),
    (["A1", "a2"], "A1,a2"),
    (["a-1", "a-2"], "a-[1-2]"),
    (["n1x", "n2x"], "n1x,n2x"),
    (["n1", "n2", "n4-5"], "n[1-2],n4-5"),
    (["node-a-1"], "node-a-1"),
    (_n("gpu-", range(1, 12801), 5), "gpu-[00001-12800]"),
]


@pytest.mark.parametrize(("expr", "hosts"), EXPAND_CASES, ids=lambda v: repr(v)[:40])
def test_expand_table(expr: str, hosts: list[str]) -> None:
    assert expand(expr) == hosts
    if hosts:
        assert first(expr) == hosts[0]


def test_expand_table_matches_scontrol(scontrol: Scontrol) -> None:
    got = scontrol.hostnames([expr for expr, _ in EXPAND_CASES])
    wrong = {expr: got[expr] for expr, hosts in EXPAND_CASES if got[expr] != hosts}
    assert not wrong, f"table disagrees with scontrol: {wrong}"


@pytest.mark.parametrize(("expr", "message"), ERROR_CASES, ids=lambda v: repr(v)[:40])
def test_expand_errors(expr: str, message: str) -> None:
    with pytest.raises(HostlistError) as err:
        expand(expr)
    assert message in str(err.value)
    assert repr(expr) in str(err.value)  # the message names the expression
    with pytest.raises(HostlistError):
        first(expr)


def test_errors_are_errors_for_scontrol_too(scontrol: Scontrol) -> None:
    got = scontrol.hostnames([expr for expr, _ in ERROR_CASES])
    assert {e: hosts for e, hosts in got.items() if hosts is not None} == {}


@pytest.mark.parametrize(("expr", "message", "_"), REJECTED_GARBAGE, ids=lambda v: repr(v)[:40])
def test_garbage_that_scontrol_accepts_is_rejected(expr: str, message: str, _: list[str]) -> None:
    with pytest.raises(HostlistError, match="invalid hostlist") as err:
        expand(expr)
    assert message in str(err.value)


def test_scontrol_really_accepts_that_garbage(scontrol: Scontrol) -> None:
    if not scontrol.version().startswith("slurm-wlm 22.05"):
        pytest.skip(f"recorded from Slurm 22.05, this is {scontrol.version()}")
    got = scontrol.hostnames([expr for expr, _, _ in REJECTED_GARBAGE])
    assert got == {expr: slurm for expr, _, slurm in REJECTED_GARBAGE}


def test_error_is_a_value_error() -> None:
    assert issubclass(HostlistError, ValueError)
    with pytest.raises(TypeError):
        expand(None)  # type: ignore[arg-type]


def test_any_whitespace_separates() -> None:
    # scontrol only splits on space and tab and keeps "\n" inside a name;
    # a list read from a file should not end in a host called "n2\n".
    assert expand("n1\nn2\r\n") == ["n1", "n2"]


def test_ranges_beyond_slurm_limit_are_allowed() -> None:
    # Slurm 22.05 refuses one range of more than 65536 hosts; 100k-node lists need it.
    hosts = expand("n[000001-100000]")
    assert len(hosts) == 100_000
    assert hosts[0] == "n000001" and hosts[-1] == "n100000"


def test_host_count_is_capped_before_expanding() -> None:
    with pytest.raises(HostlistError, match="MAX_HOSTS"):
        expand(f"n[1-{MAX_HOSTS + 1}]")
    with pytest.raises(HostlistError, match="MAX_HOSTS"):
        first("a[1-100000]b[1-100000]")  # 10^10 hosts, refused without building them
    assert len(expand(f"n[1-{MAX_HOSTS}]")) == MAX_HOSTS


def test_first() -> None:
    assert first("gpu-[003-004,001]") == "gpu-003"
    assert first(",, rack[2,1]-n[07-08],x") == "rack2-n07"
    assert first("login,n[1-2]") == "login"
    assert first("a[1-2]b[3-4]c[5-6]") == "a1b3c5"
    for expr in ("", " , ", "\t"):
        with pytest.raises(HostlistError, match="no hosts"):
            first(expr)
    with pytest.raises(HostlistError, match="descending"):
        first("n1,n[3-1]")  # the rest is still validated


def test_expand_is_fast() -> None:
    seconds = min(timeit.repeat(lambda: expand("gpu-[00001-12800]"), number=1, repeat=5))
    assert seconds < 0.05, f"expand took {seconds * 1000:.1f} ms"


def test_first_does_not_expand() -> None:
    seconds = min(timeit.repeat(lambda: first("gpu-[000001-100000]"), number=1, repeat=5))
    assert seconds < 0.005, f"first took {seconds * 1000:.2f} ms"


@pytest.mark.parametrize(("names", "expected"), COMPRESS_CASES, ids=lambda v: repr(v)[:40])
def test_compress_table(names: list[str], expected: str) -> None:
    assert compress(names) == expected
    assert expand(expected) == names


def test_compress_table_matches_scontrol(scontrol: Scontrol) -> None:
    got = scontrol.hostlist([names for names, _ in COMPRESS_CASES])
    assert got == [expected for _, expected in COMPRESS_CASES]


def test_compress_edge_cases() -> None:
    assert compress([]) == ""
    assert compress(iter(["n1", "n2"])) == "n[1-2]"
    # a suffix too long for 64 bits stays a plain name (Slurm would clip it)
    assert compress(["n99999999999999999999", "n1"]) == "n99999999999999999999,n1"


@pytest.mark.parametrize("name", ["", "a b", "a,b", "n[1]", "n]", "a\n"])
def test_compress_rejects_names_a_hostlist_cannot_hold(name: str) -> None:
    with pytest.raises(HostlistError):
        compress(["ok1", name])


def test_compress_rejects_a_bare_string() -> None:
    with pytest.raises(TypeError):
        compress("n1")  # type: ignore[arg-type]


# ---- generated expressions -------------------------------------------------

_NUMBER = st.text("0123456789", min_size=1, max_size=3)
# no whitespace (scontrol splits stdin lines on it), no brackets, no '/' (file paths)
_TEXT = st.text("abnx019-._%:", max_size=3)


@st.composite
def _range_element(draw: st.DrawFn, valid: bool = False) -> str:
    lo = draw(_NUMBER)
    kinds = ["single", "range", "range", "range"] + ([] if valid else ["bad"])
    kind = draw(st.sampled_from(kinds))
    if kind == "single":
        return lo
    if kind == "range":
        hi = int(lo) + draw(st.integers(0 if valid else -1, 4))  # -1: descending
        pad = draw(st.integers(0, 3))
        return f"{lo}-{hi:0{pad}d}" if hi >= 0 else f"{lo}-0"
    # malformed elements that both scontrol and expand() reject
    return draw(st.sampled_from(["", "a", "x", "1x2", f"{lo}-{lo}-{lo}", f"-{lo}", f"{lo}--{lo}"]))


@st.composite
def _item(draw: st.DrawFn) -> str:
    groups = draw(st.integers(0, 3))
    if groups == 0:
        return draw(_TEXT.filter(bool))
    parts = []
    for i in range(groups):
        # Slurm ignores errors in all but the last two groups (see REJECTED_GARBAGE)
        element = _range_element(valid=i < groups - 2)
        parts.append(draw(_TEXT))
        parts.append("[" + ",".join(draw(st.lists(element, min_size=1, max_size=3))) + "]")
    parts.append(draw(st.sampled_from(["", "", "", "", "x", "-1"])))  # text after the last ']'
    return "".join(parts)


@st.composite
def _expression(draw: st.DrawFn) -> str:
    items = draw(st.lists(_item(), min_size=1, max_size=4))
    expr = ""
    for i, item in enumerate(items):
        expr += (draw(st.sampled_from([",", ",", ",,"])) if i else "") + item
    return draw(st.sampled_from(["", ","])) + expr + draw(st.sampled_from(["", ","]))


def _expand_or_none(expr: str) -> list[str] | None:
    try:
        return expand(expr)
    except HostlistError:
        return None


@PROPERTY
@given(st.lists(_expression(), min_size=1, max_size=8))
def test_expand_matches_scontrol(scontrol: Scontrol, exprs: list[str]) -> None:
    slurm = scontrol.hostnames(exprs)
    for expr in exprs:
        assert _expand_or_none(expr) == slurm[expr], expr


@PROPERTY
@given(_expression())
def test_first_agrees_with_expand(expr: str) -> None:
    hosts = _expand_or_none(expr)
    if hosts:
        assert first(expr) == hosts[0]
    else:
        with pytest.raises(HostlistError):
            first(expr)


_PREFIX = st.sampled_from(["n", "gpu-", "rack1-n", "a1b", "", "x.y_", "N"])


@st.composite
def _name_run(draw: st.DrawFn) -> list[str]:
    """A run of consecutive numbers (what compress merges), or one unnumbered name."""
    prefix = draw(_PREFIX)
    if draw(st.integers(0, 4)) == 0:
        return [prefix + draw(st.sampled_from(["", "x", "-a", "1x"])) or "login"]
    start = draw(st.integers(0, 120))
    width = draw(st.integers(0, 4))
    return _n(prefix, range(start, start + draw(st.integers(1, 4))), width)


_NAMES = st.lists(_name_run(), min_size=1, max_size=6).map(lambda rs: [n for r in rs for n in r])


@PROPERTY
@given(st.lists(_NAMES, min_size=1, max_size=8))
def test_compress_matches_scontrol(scontrol: Scontrol, name_lists: list[list[str]]) -> None:
    assert [compress(names) for names in name_lists] == scontrol.hostlist(name_lists)


_ANY_NAME = (
    st.tuples(
        st.text(st.characters(exclude_characters="[], \t\n\r\v\f", exclude_categories=("Cs",))),
        st.one_of(st.just(""), _NUMBER, st.integers(0, 10**30).map(str)),
    )
    .map("".join)
    .filter(bool)
)


@PROPERTY
@given(st.one_of(st.lists(_ANY_NAME, max_size=12), _NAMES))
def test_compress_round_trips_in_any_order(names: list[str]) -> None:
    assert expand(compress(names)) == names
    assert expand(compress(sorted(names))) == sorted(names)
