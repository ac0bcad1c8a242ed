"""attempt-N/record.json, the run record's node-side part: one writer for the Contract and the framework adapters.

Rank 0 of the training script knows facts nothing outside it can: what it
resumed from (a committed generation, an in-memory snapshot, nothing), the
data position, the optimizer. `clusterctl record` and `report` read them
(views/record.py); a run outside clusterctl writes nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from clusterctl import envnames, rundir
from clusterctl.trainer.settings import attempt


def write(groups: dict[str, dict[str, Any]], *, rank: int, replace: bool, writer: str) -> None:
    """Merge facts into attempt-N/record.json (rank 0 only); a failed write warns, never stops training."""
    attempt_dir = os.environ.get(envnames.ATTEMPT_DIR)
    if rank != 0 or not attempt_dir:
        return
    path = Path(attempt_dir) / rundir.RECORD
    try:
        record = rundir.read_json(path) or {}
        for group, facts in groups.items():
            facts = json.loads(json.dumps(facts, default=str))
            merged = record.setdefault(group, {})
            for key, value in facts.items():
                if replace or key not in merged:
                    merged[key] = value
        record["attempt"] = attempt()
        record["written_by"] = f"rank 0 ({writer})"
        record["time"] = round(time.time(), 3)
        rundir.write_json_atomic(path, record)
    except (OSError, TypeError, ValueError) as exc:
        print(f"clusterctl: warning: could not write the run record {path}: {exc}", file=sys.stderr, flush=True)


def resumed(directory: Path, world: int, *, generation: Any = None, memory: Any = None,
            memory_path: Path | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The record's `recovery` group and `data.resumed_position` for what a resume chose: a snapshot, a generation, nothing.

    `memory` is a checkpoint.snapshots.Restored (kept in `memory_path`'s
    node), `generation` a checkpoint.generations.Generation; neither: from scratch.
    """
    from clusterctl.checkpoint.manifest import FORMAT

    recovery: dict[str, Any] = {"schema_version": FORMAT, "checkpoint_dir": str(directory)}
    if memory is not None:
        peers = ", ".join(f"rank {r} from rank {q}'s node" for r, q in sorted(memory.served.items()))
        other = memory.remapped_from  # another width's snapshots (an elastic change of dp)
        width = f" of {other} ranks, remapped to {world}" if other else ""
        recovery.update(resumed=True, start_step=memory.step + 1,
                        how=f"resumed from the in-memory snapshot{width} of step {memory.step}" + (f" ({peers})" if peers else ""),
                        resumed_from={"step": memory.step, "memory": True, "path": str(memory_path),
                                      "from_peers": {str(r): q for r, q in memory.served.items()},
                                      **({"from_world_size": other} if other else {})})
        return recovery, {"resumed_position": {"step": memory.step}}
    if generation is None:
        recovery.update(resumed=False, resumed_from=None, start_step=0,
                        how=f"from scratch: no committed generation in {directory}")
        return recovery, {"resumed_position": None}
    found = generation.manifest
    recovery.update(
        resumed=True,
        start_step=generation.step + 1,
        how=f"resumed from step {generation.step}",
        resumed_from={
            "step": generation.step,
            "path": str(generation.path),
            **{k: found.get(k) for k in ("format", "created", "world_size", "layout", "spec_hash", "torch", "mode")},
            "resharded": found.get("world_size") != world,
        },
    )
    return recovery, {"resumed_position": {"epoch": found.get("epoch"), "data_position": found.get("data_position")}}
