"""The controller's judgement of registrations, rule by rule (pure: records in, verdict out)."""

from __future__ import annotations

from clusterctl.exitcodes import ExitCode
from clusterctl.runtime.controller.admission import judge
from clusterctl.runtime.wire.greeting import registration_proof

HOSTS = ["n1", "n2"]
TOKEN = "tok"
VERSIONS = {"torch": "2.13.0", "cuda": None, "nccl": None, "hip": None}


def record(rank: int, **changes: object) -> dict:
    """A registration as a rank writes it; `token=` one made with another attempt's secret."""
    token = str(changes.pop("token", TOKEN))
    base = {
        "rank": rank,
        "world_size": 4,
        "host": HOSTS[rank // 2],
        "pid": 1000 + rank,
        "versions": dict(VERSIONS),
        "preflight": [{"name": "cpu", "ok": True, "detail": "ok"}],
    }
    base.update(changes)
    base["proof"] = registration_proof(token, base["rank"], base["host"], base["pid"])  # type: ignore[arg-type]
    return base


def verdict(records: dict, duplicates: dict | None = None, **kw: object):  # noqa: ANN201
    return judge(records, duplicates or {}, world_size=4, hosts=HOSTS, gpus_per_node=2, token=TOKEN, **kw)


def test_all_present_is_ok() -> None:
    v = verdict({r: record(r) for r in range(4)})
    assert v.ok and v.code == 0 and "all 4 ranks" in v.message


def test_missing_ranks_are_named_with_their_hosts() -> None:
    v = verdict({0: record(0), 1: record(1)})
    assert not v.ok and v.code == ExitCode.RENDEZVOUS_FAILED
    assert v.message == "rendezvous failed: 2 of 4 ranks never arrived: ranks 2-3 on n2"
    assert {(c["rank"], c["host"]) for c in v.culprits} == {(2, "n2"), (3, "n2")}


def test_a_rank_that_failed_first_is_the_culprit_not_those_stopped_with_it() -> None:
    v = verdict({}, errors={2: "ImportError: no module named foo"}, log_errors={3: "bash: python3: command not found"})
    assert "rank 2 on n2 failed before registering: ImportError: no module named foo" in v.message
    assert "rank 3 on n2 failed before registering: bash: python3: command not found" in v.message
    assert "2 other rank(s) did not register before the job step ended: ranks 0-1 on n1" in v.message
    assert [c["rank"] for c in v.culprits] == [2, 3]


def test_duplicate_rank() -> None:
    v = verdict({r: record(r) for r in range(4)}, {2: [record(2, pid=4242, host="n2")]})
    assert not v.ok and "rank 2 registered 2 times: pid 1002 on n2, pid 4242 on n2" in v.message


def test_wrong_world_size() -> None:
    v = verdict({**{r: record(r) for r in range(4)}, 1: record(1, world_size=8)})
    assert "rank 1 on n1 was started with WORLD_SIZE=8, the plan has 4" in v.message


def test_stale_process() -> None:
    v = verdict({**{r: record(r) for r in range(4)}, 3: record(3, token="old", pid=77)})
    assert "rank 3 (pid 77 on n2) carries another attempt's token: a stale process" in v.message


def test_version_mismatch_names_the_odd_ranks() -> None:
    odd = dict(VERSIONS, torch="2.12.0")
    v = verdict({**{r: record(r) for r in range(4)}, 3: record(3, versions=odd)})
    assert "torch versions differ: 2.13.0 on most ranks, 2.12.0 on ranks 3 (n2)" in v.message
    assert v.culprits == [{"rank": 3, "host": "n2", "reason": "torch version"}]


def test_rank_on_the_wrong_node() -> None:
    v = verdict({**{r: record(r) for r in range(4)}, 1: record(1, host="n2")})
    assert "rank 1 runs on n2, the plan puts it on n1" in v.message


def test_preflight_failure_names_the_node_and_wins() -> None:
    bad = [{"name": "nic", "ok": False, "detail": "NIC mlx5_0 missing"}]
    v = verdict({**{r: record(r) for r in range(3)}, 2: record(2, preflight=bad)})
    assert v.code == ExitCode.PREFLIGHT_FAILED
    assert v.message == "preflight failed on 1 node(s): n2: rank 2 nic: NIC mlx5_0 missing"
    assert v.evidence == {"nodes": ["n2"]}


def test_several_problems_are_all_reported() -> None:
    v = verdict({0: record(0, host="n2"), 1: record(1, token="x"), 2: record(2)})
    for part in ("never arrived", "rank 0 runs on n2", "rank 1 (pid 1001 on n1) carries another attempt"):
        assert part in v.message


def test_a_stale_process_is_not_blamed_on_preflight() -> None:
    bad = [{"name": "shared_fs", "ok": False, "detail": "marker of another token missing"}]
    v = verdict({**{r: record(r) for r in range(4)}, 3: record(3, token="old", preflight=bad)})
    assert v.code == ExitCode.RENDEZVOUS_FAILED and "stale process" in v.message
