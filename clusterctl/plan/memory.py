"""Per-GPU memory estimate with pinned, published formulas.

- States: bytes per parameter by dtype (mixed-precision Adam: 2 weights +
  2 grads + 12 fp32 master/m/v = 16 B), parameters split over tp*pp (experts
  over tp*ep*pp), sharded over dp*cp per ZeRO stage as in Rajbhandari et al.
  (stage 1: optimizer, 2: + gradients, 3: + parameters).
- Activations per layer (Korthikanti et al., 16-bit): s*b*h*(34 + 5*a*s/h),
  divided by tp (sequence parallelism is on whenever tp > 1); 34*s*b*h/tp
  with selective recompute; 2*s*b*h with full recompute. s is the local
  sequence (seq_len / cp). fp32 compute doubles it. The first pipeline stage
  under 1F1B holds min(pp, grad_accum) micro-batches of its L/pp layers.
- FITS when the total leaves 10% of the GPU free for the CUDA context, NCCL
  buffers and allocator fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.errors import Problem
from clusterctl.syntax.units import format_gb

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "none": 0}
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1}
RESERVE_FRACTION = 0.10


@dataclass(frozen=True)
class ParamCounts:
    dense: int
    expert: int

    @property
    def total(self) -> int:
        return self.dense + self.expert


def count_params(
    *,
    layers: int | None,
    hidden: int | None,
    heads: int | None,
    kv_heads: int | None,
    ffn: int | None,
    vocab: int | None,
    gated_mlp: bool,
    tied_embeddings: bool,
    experts: int,
    params: int | None,
) -> ParamCounts:
    """Parameters of a decoder-only transformer (GQA attention, optional MoE MLP)."""
    if None in (layers, hidden, heads, vocab):
        return ParamCounts(dense=params or 0, expert=0)
    assert layers and hidden and heads and vocab
    kv = kv_heads or heads
    ffn_size = ffn or 4 * hidden
    head_dim = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv * head_dim
    mlp = (3 if gated_mlp else 2) * hidden * ffn_size
    norms = 2 * hidden
    router = hidden * experts
    per_layer_dense = attention + norms + (router if experts else mlp)
    embeddings = vocab * hidden * (1 if tied_embeddings else 2) + hidden
    dense = layers * per_layer_dense + embeddings
    expert = layers * experts * mlp
    if params is not None:  # an explicit total wins; keep the expert share
        dense = max(params - expert, 0)
    return ParamCounts(dense=dense, expert=expert)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU (10^9 bytes = 1 GB, as GPU memory is sold)."""

    params: int
    grads: int
    optimizer: int
    activations: int | None
    capacity: int
    params_per_gpu: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + (self.activations or 0)

    @property
    def headroom(self) -> int:
        return self.capacity - self.total

    @property
    def reserve(self) -> int:
        return int(self.capacity * RESERVE_FRACTION)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity - self.reserve

    def as_dict(self) -> dict[str, int | None | bool]:
        return {
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "total": self.total,
            "capacity": self.capacity,
            "reserve": self.reserve,
            "headroom": self.headroom,
            "fits": self.fits,
            "params_per_gpu": self.params_per_gpu,
        }


def oom_problem(memory: MemoryEstimate | None) -> Problem | None:
    """Why a submission is refused for memory, with the plan's numbers; None when it fits or no model shape was given."""
    if memory is None or memory.fits:
        return None
    parts = [("params", memory.params), ("grads", memory.grads), ("optimizer", memory.optimizer),
             ("activations", memory.activations)]
    split = ", ".join(f"{name} {format_gb(value)}" for name, value in parts if value is not None)
    return Problem("model", f"{format_gb(memory.total)} per GPU",
                   f"at most {format_gb(memory.capacity - memory.reserve)} of the GPU's {format_gb(memory.capacity)}"
                   f" (10% kept free; the estimate: {split}): raise parallel.tp or parallel.pp, shard (sharding), recompute, or lower batch.micro;"
                   " `clusterctl plan` shows the table. --allow-oom (allow_oom: true) submits it anyway")


@dataclass(frozen=True)
class MemoryInputs:
    counts: ParamCounts
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    edp: int
    params_dtype: str
    grads_dtype: str
    master_dtype: str
    optimizer_dtype: str
    optimizer: str
    sharding: str
    shard_group: int
    compute_dtype: str
    recompute: str
    seq_len: int
    micro: int
    grad_accum: int
    layers: int | None
    hidden: int | None
    heads: int | None
    capacity_bytes: int


def shard_factors(sharding: str, degree: int) -> tuple[int, int, int]:
    """Divisors for (params, grads, optimizer state) under a ZeRO stage."""
    if sharding == "zero1":
        return 1, 1, degree
    if sharding == "zero2":
        return 1, degree, degree
    if sharding in ("zero3", "full_shard", "hybrid_shard"):
        return degree, degree, degree
    return 1, 1, 1


def estimate_memory(m: MemoryInputs) -> MemoryEstimate:
    dense_local = m.counts.dense / (m.tp * m.pp)
    expert_local = m.counts.expert / (m.tp * m.ep * m.pp)
    if m.sharding == "hybrid_shard":
        dense_degree = expert_degree = m.shard_group
    else:
        dense_degree, expert_degree = m.dp * m.cp, m.edp
    dp_, dg, do = shard_factors(m.sharding, dense_degree)
    ep_, eg, eo = shard_factors(m.sharding, expert_degree)
    state_bytes = BYTES[m.master_dtype] + OPTIMIZER_STATES[m.optimizer] * BYTES[m.optimizer_dtype]
    params = dense_local * BYTES[m.params_dtype] / dp_ + expert_local * BYTES[m.params_dtype] / ep_
    grads = dense_local * BYTES[m.grads_dtype] / dg + expert_local * BYTES[m.grads_dtype] / eg
    optimizer = dense_local * state_bytes / do + expert_local * state_bytes / eo
    return MemoryEstimate(
        params=int(round(params)),
        grads=int(round(grads)),
        optimizer=int(round(optimizer)),
        activations=activation_bytes(m),
        capacity=m.capacity_bytes,
        params_per_gpu=int(round(dense_local + expert_local)),
    )


def activation_bytes(m: MemoryInputs) -> int | None:
    """Activations held by the first pipeline stage; None without the model shape."""
    if m.layers is None or m.hidden is None or m.heads is None:
        return None
    s = m.seq_len / m.cp
    b, h, a, t = m.micro, m.hidden, m.heads, m.tp
    if m.recompute == "full":
        per_layer = 2 * s * b * h
    elif m.recompute == "selective":
        per_layer = 34 * s * b * h / t
    else:
        per_layer = s * b * h * (34 + 5 * a * s / h) / t
    if m.compute_dtype == "fp32":
        per_layer *= 2
    in_flight = min(m.pp, m.grad_accum)
    return int(round(per_layer * (m.layers / m.pp) * in_flight))
