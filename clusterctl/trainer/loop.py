"""The reference training loop: DDP or FSDP2, gradient accumulation, the recovery contract.

Deterministic on CPU (gloo, pinned threads, deterministic algorithms): two
runs from the same checkpoint produce bitwise-equal losses, which the resume
test relies on. bf16 autocast where the device supports it (CUDA with bf16).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from clusterctl import envnames, rundir
from clusterctl.trainer import buckets, busy
from clusterctl.trainer.contract import Contract
from clusterctl.trainer.data import HELD_OUT_BASE, MarkovTokens, Regression, TokenShards
from clusterctl.trainer.models import MLP, TinyGPT
from clusterctl.trainer.sampler import DistributedSampler

DATASET_SIZE = 1 << 20
BUSY_CALIBRATION_S = 0.4


@dataclass
class TrainConfig:
    model: str = "transformer"  # transformer | mlp
    steps: int = 200
    micro: int = 4
    grad_accum: int = 1
    seq_len: int = 64
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    ffn: int = 256
    vocab: int = 256
    lr: float = 3e-3
    seed: int = 0
    parallel: str = "ddp"  # ddp | fsdp
    eval_interval: int = 25
    eval_samples: int = 64
    target_loss: float | None = None
    record_samples: bool = False
    out_dir: str | None = None  # where metrics go outside clusterctl
    checkpoint_dir: str | None = None  # default: the job's checkpoint.dir, or <run>/checkpoints
    checkpoint_interval: int | None = None  # default: the job's checkpoint.interval
    step_compute_s: float = 0.0  # extra busy compute per step (seconds of wall time, calibrated at start-up)
    data_dir: str | None = None  # read samples from memory-mapped token shards here (written once if missing)
    data_samples: int = 4096  # samples in those shards: an epoch is data_samples // dp samples per rank
    data_cold: bool = False  # drop the shards from the page cache first: the first epoch reads cold
    extra: dict[str, Any] = field(default_factory=dict)


def out_dir(config: TrainConfig) -> Path:
    attempt = os.environ.get(envnames.ATTEMPT_DIR)
    path = Path(attempt) if attempt else Path(config.out_dir or "trainer-out")
    path.mkdir(parents=True, exist_ok=True)
    return path


def setup() -> tuple[int, int, torch.device]:
    """Join the process group (env://; under clusterctl it is the controller's store)."""
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        torch.use_deterministic_algorithms(True)
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def build(config: TrainConfig, device: torch.device) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(config.seed)  # identical initial weights on every rank
    if config.model == "mlp":
        return MLP(config.hidden, 4 * config.hidden, config.layers).to(device), Regression(config.hidden, config.seed)
    model = TinyGPT(config.vocab, config.seq_len, config.layers, config.hidden, config.heads, config.ffn).to(device)
    source = MarkovTokens(config.vocab, config.seq_len, config.seed)
    if not config.data_dir:
        return model, source
    directory = Path(config.data_dir)
    if dist.get_rank() == 0 and not (directory / TokenShards.MANIFEST).exists():
        TokenShards.write(directory, source, config.data_samples)
    dist.barrier()
    shards = TokenShards(directory, source)
    if config.data_cold:
        shards.drop_cache()
    return model, shards


def dataset_size(config: TrainConfig) -> int:
    return config.data_samples if config.data_dir else DATASET_SIZE


def wrap(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> torch.nn.Module:
    if config.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in getattr(model, "blocks", []):
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def bf16_autocast(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def autocast(device: torch.device) -> Any:
    if bf16_autocast(device):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def described(config: TrainConfig, world: int, device: torch.device) -> dict[str, Any]:
    """What only this trainer knows, for the run record (Contract.describe): the plan may say otherwise."""
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("out_dir", "extra")}
    if config.model == "mlp":
        dataset = {"kind": "synthetic regression (clusterctl.trainer.data.Regression)", "features": config.hidden}
    else:
        dataset = {"kind": "synthetic Markov token chains (clusterctl.trainer.data.MarkovTokens)",
                   "vocab": config.vocab, "seq_len": config.seq_len}
    dataset.update(size=dataset_size(config), generator_seed=config.seed, held_out_ids_from=HELD_OUT_BASE)
    if config.data_dir and (Path(config.data_dir) / TokenShards.MANIFEST).exists():
        manifest = json.loads((Path(config.data_dir) / TokenShards.MANIFEST).read_text())
        dataset.update(kind=manifest["kind"], directory=config.data_dir,
                       shards={s["file"]: s["sha256"] for s in manifest["shards"]})
    return {
        "training": {
            "trainer": {"name": "clusterctl.trainer", "config": settings},
            "schedule": {"kind": "constant", "lr": config.lr},
            "precision": {"autocast": "bf16" if bf16_autocast(device) else "off", "parameters": "fp32", "optimizer_state": "fp32"},
            "batch": {"micro": config.micro, "grad_accum": config.grad_accum,
                      "global": config.micro * config.grad_accum * world, "seq_len": config.seq_len},
            "seeds": {"model_init": config.seed, "dataset": config.seed, "sampler": config.seed},
        },
        "data": {"dataset": dataset},
    }


def loss_of(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> torch.Tensor:
    inputs, targets = (t.to(device) for t in batch)
    with autocast(device):
        return model(inputs, targets)


def evaluate(model: torch.nn.Module, data: Any, config: TrainConfig, rank: int, world: int, device: torch.device) -> float:
    ids = [HELD_OUT_BASE + i for i in range(rank, config.eval_samples, world)]
    total = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for start in range(0, len(ids), config.micro):
            chunk = ids[start : start + config.micro]
            total[0] += loss_of(model, data.batch(chunk), device).double() * len(chunk)
            total[1] += len(chunk)
    dist.all_reduce(total)
    return float(total[0] / total[1])


def calibrate_busy(seconds: float, device: torch.device, world: int) -> float:
    """Busy-compute units per wall second, the same on every rank (collective; every rank calls it).

    All ranks calibrate at once, right after a barrier, so each measures the CPU
    share it really has while its peers run too (ranks may share cores). Every
    rank then uses the MEAN of the ranks' rates, so all do the same number of
    units per step and a rank slowed later shows up as slower. The mean, not the
    MIN: each rank measures the same thing (the same unit on an equal share), so
    their differences are scheduling noise, which the mean averages out while the
    MIN turns it into bias — the unluckiest of N rates decides, further below the
    typical rate the more ranks there are, and one rank disturbed while
    calibrating (stopped, or briefly crowded out) would cut every rank's busy
    part by its factor instead of by 1/N of it. Either way the ratio between
    ranks, which the straggler detector compares, is unchanged.
    """
    dist.barrier()
    rate = torch.tensor([busy.calibrate(seconds)], dtype=torch.float64, device=device)
    dist.all_reduce(rate, op=dist.ReduceOp.SUM)
    return float(rate.item()) / world


def run_busy_rate(seconds: float, device: torch.device, rank: int, world: int) -> float:
    """`calibrate_busy`'s rate, measured once per run and world size: a restart reuses it (collective).

    The calibration's 0.4 s belong to this stand-in's compute, not to a
    restart: a real trainer has nothing like it, and a warm restart takes
    about 3 s in all. Rank 0 reads the rate its run measured (the run
    directory's busy-rate file) and every rank takes that one, or all
    calibrate together when there is none.
    """
    path = Path(os.environ[envnames.RUN_DIR]) / rundir.BUSY_RATE if os.environ.get(envnames.RUN_DIR) else None
    known = rundir.read_json(path) if rank == 0 and path is not None else None
    found = torch.tensor([float(known["units_per_s"]) if known and known.get("world") == world else 0.0],
                         dtype=torch.float64, device=device)
    dist.broadcast(found, src=0)
    if found.item() > 0:
        return float(found.item())
    rate = calibrate_busy(seconds, device, world)
    if rank == 0 and path is not None:
        rundir.write_json_atomic(path, {"world": world, "units_per_s": rate})
    return rate


def check_layout() -> None:
    """The reference trainer is data parallel only: refuse a plan that asks for more."""
    from clusterctl.trainer.settings import run_settings

    run = run_settings()
    par = run.parallel.sizes() if run is not None else {}
    other = {k: v for k, v in par.items() if k in ("tp", "pp", "cp", "ep") and v != 1}
    if other:
        dims = ", ".join(f"{k}={v}" for k, v in sorted(other.items()))
        raise SystemExit(
            f"clusterctl.trainer: the reference trainer is data parallel only (DDP or FSDP); the job asks for {dims}."
            " Set them to 1, or run a trainer that implements them (the plan's groups are in attempt-N/manifest.json)."
        )


def train(config: TrainConfig) -> dict[str, Any]:
    check_layout()
    rank, world, device = setup()
    busy_rate = run_busy_rate(BUSY_CALIBRATION_S, device, rank, world) if config.step_compute_s > 0 else 0.0
    busy_units = round(config.step_compute_s * busy_rate)
    model, data = build(config, device)
    model = wrap(model, config, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    sampler = DistributedSampler(dataset_size(config), rank, world, seed=config.seed)
    where = out_dir(config)
    contract = Contract(
        model, optimizer, sampler=sampler, directory=config.checkpoint_dir, interval=config.checkpoint_interval,
        metrics_dir=where,
    )
    contract.describe(**described(config, world, device))
    start = contract.resume()
    if buckets.needs_alignment(model, start):  # the resumed step sums in the uninterrupted run's layout
        buckets.align(model, lambda: loss_of(model, data.batch(list(range(config.micro))), device).backward())
    samples = open(where / f"samples-rank{rank}.jsonl", "a") if config.record_samples else None
    tokens_per_sample = config.seq_len if config.model == "transformer" else 1
    step_times: list[float] = []
    reached: dict[str, Any] | None = None
    began = time.time()
    hb = contract.heartbeat
    if rank == 0:
        print(f"training {config.model} ({config.parallel}) on {world} ranks from step {start} to {config.steps}", flush=True)
        if config.step_compute_s > 0:
            print(
                f"step_compute_s {config.step_compute_s}: {busy_units} busy units per step"
                f" ({busy_rate:.1f} units/s, the mean over ranks, calibrated once per run)",
                flush=True,
            )
    read_before = data.read_s if config.data_dir else 0.0  # the dataset's reading time so far: each step's input wait is the change
    for step in range(start, config.steps):
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), dtype=torch.float64, device=device)
        used: list[int] = []
        for micro in range(config.grad_accum):
            ids = sampler.take(config.micro)
            used += ids
            hb.phase("forward", step)
            loss = loss_of(model, data.batch(ids), device) / config.grad_accum
            hb.phase("backward", step)
            sync = micro == config.grad_accum - 1 or not hasattr(model, "no_sync")
            if sync:
                loss.backward()
            else:
                with model.no_sync():
                    loss.backward()
            step_loss += loss.detach().double()
        if busy_units:
            busy.spin(busy_units)  # extra compute: the peers wait for a slowed rank in a collective (not compute)
        hb.phase("optimizer", step)
        optimizer.step()
        hb.phase("collective", step)
        dist.all_reduce(step_loss)
        mean_loss = float(step_loss) / world
        if samples is not None:
            samples.write(json.dumps({"step": step, "ids": used}) + "\n")
            samples.flush()
        if config.data_dir:
            data_s, read_before = data.read_s - read_before, data.read_s
        record: dict[str, Any] = {
            "loss": mean_loss,
            "loss_hex": float.hex(mean_loss),
            "tokens": config.micro * config.grad_accum * tokens_per_sample,
            "total_steps": config.steps,
        }
        if config.data_dir:
            record.update(data_s=round(data_s, 6), epoch=sampler.state.epoch)
        if config.eval_interval and (step + 1) % config.eval_interval == 0:
            hb.phase("eval", step)
            record["val_loss"] = evaluate(model, data, config, rank, world, device)
            if reached is None and config.target_loss is not None and record["val_loss"] <= config.target_loss:
                reached = {"step": step, "seconds": round(time.time() - began, 3), "val_loss": record["val_loss"]}
                record["target_reached"] = reached
                if rank == 0:
                    print(f"target validation loss {config.target_loss} reached at step {step} after {reached['seconds']} s", flush=True)
        hb.phase("idle", step)
        step_times.append(contract.after_step(step, **record)["step_s"])
    contract.close()
    summary = summarize(step_times, config, world, tokens_per_sample, reached)
    if config.step_compute_s > 0:
        summary["step_compute_s"] = config.step_compute_s
        summary["busy_units_per_s"] = round(busy_rate, 1)
        summary["busy_units_per_step"] = busy_units
    if rank == 0:
        print("clusterctl trainer: " + json.dumps(summary), flush=True)
        (where / rundir.TRAINER_SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    if samples is not None:
        samples.close()
    dist.destroy_process_group()
    return summary


def summarize(step_times: list[float], config: TrainConfig, world: int, tokens_per_sample: int, reached: Any) -> dict[str, Any]:
    if not step_times:
        return {"steps": 0, "target": config.target_loss, "target_reached": reached}
    ordered = sorted(step_times)
    median = statistics.median(ordered) or float("nan")  # watchdog.steps: off times no step
    return {
        "steps": len(step_times),
        "step_s": {"p50": round(median, 4), "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 4), "max": round(ordered[-1], 4)},
        "tokens_per_s": round(config.micro * config.grad_accum * world * tokens_per_sample / median, 1),
        "target": config.target_loss,
        "target_reached": reached,
    }
