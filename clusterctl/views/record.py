"""The run record: the evidence a reconstruction of one attempt of a training run needs.

Four groups: `training` (source revision and diff, model, optimizer and
schedule, precision, batch construction, parallel dimensions, seeds), `data`
(dataset identity, sampler seed, the position resumed from), `recovery`
(checkpoint schema, the generation resumed from or none) and `environment`
(torch/CUDA/NCCL/driver per node, the NCCL/CUDA/thread environment, the
container, the allocated nodes and their switches).

Who knows a fact writes it; this module only reads and assembles, so a
record can be shown for any attempt, finished or not:
- submit (login side): run.json, spec.yaml, site.yaml, code/ — the plan;
- the batch host and controller: attempt.json (the allocation) and
  manifest.json (every rank's registration: versions; local rank 0's
  environment and GPU driver, once per node);
- rank 0 of the trainer, through the contract (Contract.resume/describe):
  attempt-N/record.json — what it resumed from, its optimizer, seeds and data.

A fact that is not known is null, and its group's `unknown` says why
(field name -> reason); nothing is guessed.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from clusterctl import rundir
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, attemptjson, history, rankmanifest, read_json, runjson
from clusterctl.rundir.attemptjson import AttemptJson
from clusterctl.rundir.runjson import RunJson
from clusterctl.syntax import hostlist
from clusterctl.syntax.cpulist import format_cpulist

GROUPS = ("training", "data", "recovery", "environment")


def load(run: RunDir, attempt: int | None = None) -> dict[str, Any]:
    """The run record of one attempt (default: the latest on disk), assembled from what each writer left."""
    attempts = run.attempts()
    if attempt is not None and attempt not in attempts:
        have = ", ".join(map(str, attempts)) or "none yet"
        raise ClusterctlError(f"run {run.path.name} has no attempt {attempt} (attempts: {have})", ExitCode.USAGE)
    if attempt is None and attempts:
        attempt = attempts[-1]
    plan = runjson.read(run.path)
    spec = _yaml(run.path / rundir.SPEC)
    site = _yaml(run.path / rundir.SITE)
    adir = run.attempt(attempt) if attempt is not None else None
    node = _read(adir, rundir.RECORD)
    manifest = rankmanifest.read(adir / rundir.MANIFEST) if adir is not None else None
    attempt_json = attemptjson.read(adir) if adir is not None else None
    no_node_record = _why_no_node_record(run, attempt, node is not None)
    record = {
        "run": {
            "id": run.path.name,
            "path": str(run.path),
            "name": plan.name if plan else None,
            "site": plan.site if plan else None,
            "spec_hash": plan.spec_hash if plan else None,
            "attempts": attempts,
        },
        "attempt": attempt,
        "training": _training(run, plan, spec, node, no_node_record),
        "data": _data(node, no_node_record),
        "recovery": _recovery(run, plan, node, attempt, no_node_record),
        "environment": _environment(run, plan, spec, site, attempt, attempt_json, manifest),
    }
    for group in GROUPS:  # the reasons last, after the facts they are about
        if "unknown" in record[group]:
            record[group]["unknown"] = record[group].pop("unknown")
    return record


# --- reading ------------------------------------------------------------------------------
def _yaml(path: Path) -> dict[str, Any] | None:
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
    except Exception:  # noqa: BLE001 - an unreadable or broken file is a missing fact
        return None
    return data if isinstance(data, dict) else None


def _read(adir: Path | None, name: str) -> dict[str, Any] | None:
    return read_json(adir / name) if adir is not None else None


def _text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _why_no_node_record(run: RunDir, attempt: int | None, present: bool) -> str | None:
    """Why attempt-N/record.json is absent (None when it is there)."""
    if present:
        return None
    if attempt is None:
        return "no attempt has started yet: rank 0 of the trainer writes its part when an attempt resumes"
    return (
        f"{rundir.ATTEMPT_PREFIX}{attempt}/{rundir.RECORD} is missing: rank 0 of the trainer writes it when it calls"
        " Contract.resume(); the attempt ended before that, or its script does not use the contract API"
        " (clusterctl.trainer.Contract)"
    )


def _put(group: dict[str, Any], key: str, value: Any, reason: str | None) -> None:
    """Set a fact; when it is unknown (None), say why in the group's `unknown`."""
    group[key] = value
    if value is None and reason:
        group.setdefault("unknown", {})[key] = reason


# --- training -----------------------------------------------------------------------------
def source(run: RunDir) -> tuple[dict[str, Any] | None, str | None]:
    """The submitting tree's revision, whether it was dirty, and the diff's size and sha256 (from code/)."""
    code = run.path / rundir.CODE
    revision = _text(code / "revision.txt")
    if revision is None:
        return None, f"{rundir.CODE}/revision.txt is missing: submit records the tree it was run from there"
    text = revision.strip()
    if text.startswith("not a git repository"):
        return {"repository": None, "revision": None, "dirty": None, "diff": None, "note": text}, (
            "the job was submitted from outside a git repository: no revision to record"
        )
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    found_revision = fields.get("revision")
    if found_revision == "(no commits)":
        found_revision = None
    status = _text(code / "status.txt")
    diff_path = code / "diff.patch"
    diff: dict[str, Any] | None = None
    try:
        size = diff_path.stat().st_size
    except OSError:
        size = None
    if size is not None:
        digest, files = hashlib.sha256(), 0
        with open(diff_path, "rb") as fh:
            for line in fh:
                digest.update(line)
                files += line.startswith(b"diff --git ")
        diff = {"path": f"{rundir.CODE}/diff.patch", "bytes": size, "sha256": digest.hexdigest(), "files": files}
    lines = [line for line in (status or "").splitlines() if line.strip()]
    tracked = [line for line in lines if not line.startswith("??")]
    found = {
        "repository": fields.get("repository"),
        "revision": found_revision,
        "dirty": bool(tracked) if status is not None else None,  # uncommitted changes to tracked files (diff.patch)
        "changed_paths": len(tracked) if status is not None else None,
        "untracked_paths": len(lines) - len(tracked) if status is not None else None,
        "diff": diff,
    }
    if found_revision is None:
        return found, "the repository had no commits when the job was submitted"
    if status is None:
        return found, f"{rundir.CODE}/status.txt is missing: whether the tree was dirty is not known"
    return found, None


def _training(
    run: RunDir, plan: RunJson | None, spec: dict[str, Any] | None, node: dict[str, Any] | None, no_node: str | None
) -> dict[str, Any]:
    planned = plan.to_dict() if plan is not None else {}
    trainer = (node or {}).get("training") or {}
    group: dict[str, Any] = {}
    found, why = source(run)
    _put(group, "source", found, why)
    if found is not None and why:
        group.setdefault("unknown", {})["source.revision" if found.get("revision") is None else "source.dirty"] = why
    no_plan = f"{rundir.RUN_JSON} is missing or unreadable" if plan is None else None
    _put(group, "command", planned.get("command"), no_plan)
    _put(group, "spec_hash", planned.get("spec_hash"), no_plan)
    model_spec = planned.get("model")
    _put(group, "model", {
        "spec": model_spec,
        "trainer": {k: trainer.get(k) for k in ("model_type", "parameters") if k in trainer} or None,
    }, None)
    if not trainer:
        group.setdefault("unknown", {})["model.trainer"] = no_node
    optimizer_spec = {k: spec.get(k) for k in ("optimizer", "sharding", "recompute") if k in spec} if spec else None
    _put(group, "optimizer", {"spec": optimizer_spec, "trainer": trainer.get("optimizer")}, None)
    if trainer.get("optimizer") is None:
        group.setdefault("unknown", {})["optimizer.trainer"] = no_node or "the trainer recorded no optimizer"
    _put(group, "schedule", trainer.get("schedule"),
         no_node or "the trainer did not describe its schedule (Contract.describe(training={'schedule': ...}))")
    _put(group, "precision", {"spec": planned.get("precision"), "trainer": trainer.get("precision")}, None)
    if trainer.get("precision") is None:
        group.setdefault("unknown", {})["precision.trainer"] = (
            no_node or "the trainer did not describe its numerical formats (Contract.describe(training={'precision': ...}))"
        )
    plan_batch = dict(planned["batch"], seq_len=planned["seq_len"]) if plan is not None else None
    _put(group, "batch", {"plan": plan_batch, "trainer": trainer.get("batch")}, None)
    if trainer.get("batch") is None:
        group.setdefault("unknown", {})["batch.trainer"] = (
            no_node or "the trainer did not describe its batch construction (Contract.describe(training={'batch': ...}))"
        )
    parallel = dict(planned["parallel"], world_size=planned["world_size"], rank_order=planned["rank_order"]) if plan else None
    _put(group, "parallel", parallel, no_plan)
    seeds = dict(trainer.get("seeds") or {})
    if "torch_initial_seed" in trainer:
        seeds["torch_initial_seed"] = trainer["torch_initial_seed"]
    _put(group, "seeds", seeds or None, no_node or "the trainer recorded no seeds (Contract.describe(training={'seeds': ...}))")
    _put(group, "process_group", trainer.get("process_group"), no_node)
    _put(group, "trainer", trainer.get("trainer"), no_node or "the script did not name itself (Contract.describe(training={'trainer': ...}))")
    return group


# --- data ---------------------------------------------------------------------------------
def _data(node: dict[str, Any] | None, no_node: str | None) -> dict[str, Any]:
    facts = (node or {}).get("data") or {}
    group: dict[str, Any] = {}
    _put(group, "dataset", facts.get("dataset"),
         no_node or "the trainer did not describe its dataset (Contract.describe(data={'dataset': ...}))")
    _put(group, "sampler", facts.get("sampler"), no_node or "the contract was given no sampler (Contract(..., sampler=...))")
    if "resumed_position" in facts:
        group["resumed_position"] = facts["resumed_position"]
        if facts["resumed_position"] is None:
            group["from_scratch"] = True  # known: nothing to resume, the data starts at its beginning
    else:
        _put(group, "resumed_position", None, no_node or "the trainer did not record where it resumed")
    for key, value in facts.items():
        group.setdefault(key, value)  # whatever else the script described
    return group


# --- recovery -----------------------------------------------------------------------------
def _recovery(
    run: RunDir, plan: RunJson | None, node: dict[str, Any] | None, attempt: int | None, no_node: str | None
) -> dict[str, Any]:
    facts = (node or {}).get("recovery") or {}
    group: dict[str, Any] = {}
    _put(group, "schema_version", facts.get("schema_version"), no_node or "the trainer did not record it")
    _put(group, "checkpoint_dir", facts.get("checkpoint_dir") or (str(plan.checkpoint_dir(run.path)) if plan else None),
         "neither the trainer nor run.json says where checkpoints go")
    if "resumed" in facts:
        for key in ("resumed", "resumed_from", "start_step", "how"):
            group[key] = facts.get(key)
    else:
        for key in ("resumed", "resumed_from", "start_step", "how"):
            _put(group, key, None, no_node)
    _put(group, "begun_by", _begun_by(run, attempt),
         "no event in attempts.jsonl says how this attempt began" if attempt not in (None, 1) else None)
    return group


def _begun_by(run: RunDir, attempt: int | None) -> dict[str, Any] | None:
    """How this attempt came about: the first of a job, or the decision (the attempt before's `next`, a requeue) it followed."""
    if attempt is None:
        return None
    found = history.read(run).attempt(attempt)
    if found is None or found.begun_by is None:
        return None
    keep = ("event", "how", "exit", "reason", "committed_step", "next_job", "exclude", "by")
    begun = {k: found.begun_by[k] for k in keep if k in found.begun_by}
    if found.start is not None:
        begun["job_id"] = found.job_id or None
    return begun


# --- environment --------------------------------------------------------------------------
def switch_paths(site: dict[str, Any] | None, hosts: list[str]) -> tuple[dict[str, list[str]], str | None]:
    """host -> [leaf switch, ..., root] from the site config's switch tree (or [block]); the reason when unknowable."""
    topo = (site or {}).get("topology") or {}
    kind = topo.get("kind", "flat")
    if site is None:
        return {}, f"{rundir.SITE} is missing or unreadable"
    if kind == "block":
        owner: dict[str, str] = {}
        for block in topo.get("blocks") or []:
            try:
                for name in hostlist.expand(str(block.get("nodes", ""))):
                    owner.setdefault(name, str(block.get("name")))
            except hostlist.HostlistError:
                continue
        return {h: [owner[h]] for h in hosts if h in owner}, None
    switches = topo.get("switches") or []
    if kind != "tree" or not switches:
        return {}, f"the site config describes no switch tree (topology kind {kind!r})"
    leaf_of: dict[str, str] = {}
    parent: dict[str, str] = {}
    for sw in switches:
        name = str(sw.get("name"))
        try:
            for node in hostlist.expand(str(sw["nodes"])) if sw.get("nodes") else []:
                leaf_of.setdefault(node, name)
            for child in hostlist.expand(str(sw["switches"])) if sw.get("switches") else []:
                parent.setdefault(child, name)
        except hostlist.HostlistError:
            continue
    paths: dict[str, list[str]] = {}
    for host in hosts:
        if host not in leaf_of:
            continue
        path = [leaf_of[host]]
        while path[-1] in parent and parent[path[-1]] not in path:
            path.append(parent[path[-1]])
        paths[host] = path
    return paths, None


def _container(spec: dict[str, Any] | None, runtime: str | None,
               manifest: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    if spec is None:
        return None, f"{rundir.SPEC} is missing or unreadable"
    box = spec.get("container") or {}
    image = box.get("image")
    if not image:
        return {"image": None, "note": "no container: the spec sets no container.image (the ranks ran on the node's own software)"}, None
    digest = image.split("@", 1)[1] if "@sha256:" in image else None
    found = {"image": image, "runtime": runtime or box.get("runtime"), "mounts": box.get("mounts") or [], "digest": digest}
    rank0 = next((r for r in (manifest or {}).get("ranks") or [] if isinstance(r, dict) and r.get("rank") == 0), None)
    if rank0 is not None and isinstance(rank0.get("container_env"), dict):
        found["rank0_env"] = rank0["container_env"]  # what rank 0 ran with inside the image, secrets by name
    if digest is None:
        found["unknown"] = {
            "digest": "not resolved: the image is named by tag, and pyxis/enroot report no digest to the ranks;"
            " pin it as image@sha256:... to record it"
        }
    return found, None


def _nodes(
    manifest: dict[str, Any], paths: dict[str, list[str]], switch_reason: str | None
) -> list[dict[str, Any]]:
    """One entry per host from the rank registrations: its ranks, versions, driver, environment, switch path."""
    by_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    order: list[str] = []
    for rec in manifest.get("ranks") or []:
        if not isinstance(rec, dict) or rec.get("missing"):
            continue
        host = str(rec.get("host"))
        if host not in by_host:
            order.append(host)
        by_host[host].append(rec)
    nodes = []
    for host in order:
        recs = sorted(by_host[host], key=lambda r: (r.get("local_rank", 0), r.get("rank", 0)))
        first = recs[0]
        entry: dict[str, Any] = {"host": host, "ranks": format_cpulist(int(r["rank"]) for r in recs if "rank" in r)}
        versions = first.get("versions")
        entry["versions"] = versions
        odd = [r.get("rank") for r in recs if r.get("versions") != versions]
        if odd:
            entry["versions_differ_on_ranks"] = odd
        head = next((r for r in recs if r.get("local_rank") == 0), None)
        unknown: dict[str, str] = {}
        if head is None:
            entry["env"] = entry["driver"] = None
            unknown["env"] = unknown["driver"] = "local rank 0 of this node did not register"
        elif "env" not in head:
            entry["env"] = entry["driver"] = None
            unknown["env"] = unknown["driver"] = "not registered: the ranks ran a clusterctl that did not record it"
        else:
            entry["env"] = head.get("env")
            entry["driver"] = head.get("driver")
            if entry["driver"] is None:
                unknown["driver"] = "the node showed no GPU driver (/proc/driver/nvidia/version, /sys/module/amdgpu/version)"
        entry["switches"] = paths.get(host)
        if entry["switches"] is None:
            unknown["switches"] = switch_reason or f"{host} is on no switch of the site config's topology"
        if unknown:
            entry["unknown"] = unknown
        nodes.append(entry)
    return nodes


def _environment(
    run: RunDir,
    plan: RunJson | None,
    spec: dict[str, Any] | None,
    site: dict[str, Any] | None,
    attempt: int | None,
    attempt_json: AttemptJson | None,
    manifest: dict[str, Any] | None,
) -> dict[str, Any]:
    group: dict[str, Any] = {}
    where = f"{rundir.ATTEMPT_PREFIX}{attempt}" if attempt is not None else None
    if attempt_json is not None:
        a = attempt_json
        allocation = {"job_id": a.job_id, "nodelist": a.nodelist, "hosts": list(a.hosts), "spares": a.spares,
                      "batch_host": a.batch_host, "master_host": a.master_host, "master": f"{a.master_addr}:{a.master_port}",
                      "excluded": list(plan.exclude) if plan else None}
        _put(group, "allocation", allocation, None)
    else:
        _put(group, "allocation", None, "no attempt has started yet" if where is None
             else f"{where}/{rundir.ATTEMPT_JSON} is missing: the batch script writes it before the ranks start")
    hosts = list(attempt_json.hosts) if attempt_json is not None else []
    if manifest is not None:
        hosts += [str(r.get("host")) for r in manifest.get("ranks") or [] if isinstance(r, dict) and r.get("host")]
    paths, switch_reason = switch_paths(site, list(dict.fromkeys(hosts)))
    _put(group, "switches", {h: paths.get(h) for h in dict.fromkeys(hosts)} if paths else None,
         switch_reason or ("no allocated node is on a switch of the site config" if hosts else "no nodes allocated yet"))
    if manifest is not None:
        group["nodes"] = _nodes(manifest, paths, switch_reason)
        group["world_size"] = manifest.get("world_size")
    else:
        _put(group, "nodes", None, "no attempt has started yet" if where is None
             else f"{where}/{rundir.MANIFEST} is missing: the controller writes the ranks' registrations (versions,"
             " environment) at the rendezvous, which this attempt did not reach")
    if plan is not None:
        group["env_requested"] = {"job": plan.env, "site": plan.site_env}
    else:
        _put(group, "env_requested", None, f"{rundir.RUN_JSON} is missing or unreadable")
    container, why = _container(spec, plan.container if plan is not None else None, manifest)
    _put(group, "container", container, why)
    return group
