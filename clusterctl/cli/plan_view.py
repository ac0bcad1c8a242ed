"""Rich tables for `clusterctl plan`: what a person reads before spending GPU hours."""

from __future__ import annotations

from collections import Counter

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from clusterctl.config.spec import DEFAULT_LEAD_S
from clusterctl.plan import Plan
from clusterctl.plan.elastic import grouped
from clusterctl.plan.ranks import GROUP_KINDS
from clusterctl.syntax.units import format_duration, format_gb

MAX_NODES_SHOWN = 6
MAX_GPUS_SHOWN = 8
GROUP_LABELS = {
    "tp": "tensor",
    "cp": "context",
    "dp": "data",
    "pp": "pipeline",
    "tp_cp": "tensor x context",
    "dp_cp": "data x context",
    "mp": "tensor x pipeline",
    "ep": "expert",
    "edp": "expert data",
    "tp_ep": "tensor x expert",
}


def _summary(plan: Plan) -> Table:
    layout = plan.dims.layout
    table = Table(title=f"Plan for {plan.spec.name}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("site", f"{plan.site.name}, partition {plan.partition}, node type {plan.node_type_name}")
    gpu = plan.node_type
    table.add_row("GPU", f"{gpu.gpu_model} ({gpu.gpu_memory_gb:g} GB), NVLink domain {gpu.nvlink_domain}")
    spares = f" + {plan.spec.spares} spare" if plan.spec.spares else ""
    table.add_row("nodes", f"{plan.nodes}{spares} x {plan.gpus_per_node} GPUs = world size {plan.world_size}")
    dims = f"tp {layout.tp} x cp {layout.cp} x dp {layout.dp} x pp {layout.pp}"
    if layout.ep > 1:
        dims += f"; ep {layout.ep} (expert dp {layout.edp})"
    if plan.dims.vpp > 1:
        dims += f"; vpp {plan.dims.vpp}"
    table.add_row("parallel", dims + "   (rank order tp-cp-ep-dp-pp, tp fastest)")
    lead = plan.spec.lead_s
    how = "" if plan.spec.signal.lead_s is not None else (
        "; a tenth of the limit, as signal.lead_s is not given" if lead < DEFAULT_LEAD_S else "")
    table.add_row("time limit", f"{format_duration(plan.spec.time_limit)}, SIG{plan.spec.signal.name} {lead} s before it{how}")
    return table


def _rank_map(plan: Plan) -> Table:
    gpn, nodes = plan.gpus_per_node, plan.nodes
    table = Table(title="Rank map (rank on each node slot and local GPU)", title_justify="left")
    table.add_column("node")
    gpus = list(range(min(gpn, MAX_GPUS_SHOWN)))
    for g in gpus:
        table.add_column(f"GPU {g}", justify="right")
    if gpn > MAX_GPUS_SHOWN:
        table.add_column("...")
    if nodes <= MAX_NODES_SHOWN:
        shown = list(range(nodes))
    else:
        shown = list(range(MAX_NODES_SHOWN - 2)) + [-1] + [nodes - 2, nodes - 1]
    for node in shown:
        if node == -1:
            table.add_row(f"... {nodes - MAX_NODES_SHOWN + 1} more", *(["..."] * (len(table.columns) - 1)))
            continue
        cells = [str(node * gpn + g) for g in gpus]
        if gpn > MAX_GPUS_SHOWN:
            cells.append(f"... {node * gpn + gpn - 1}")
        table.add_row(str(node), *cells)
    return table


def _abbrev(ranks: list[int], limit: int = 6) -> str:
    if len(ranks) <= limit:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return "[" + ", ".join(map(str, ranks[: limit - 2])) + f", ..., {ranks[-1]}]"


def _groups(plan: Plan) -> Table:
    table = Table(title="Parallel groups", title_justify="left")
    for col in ("kind", "size", "count", "cross-node", "first group"):
        table.add_column(col, justify="right" if col in ("size", "count", "cross-node") else "left")
    shown: list[list[list[int]]] = []
    for kind in GROUP_KINDS:
        traffic = plan.traffic[kind]
        if traffic.size == 1 or plan.groups[kind] in shown:
            continue  # trivial, or the same groups as a kind already listed
        shown.append(plan.groups[kind])
        crossing = f"{traffic.cross_node}/{traffic.count}"
        style = "yellow" if kind in ("tp", "tp_cp") and traffic.cross_node else ""
        table.add_row(
            f"{kind} ({GROUP_LABELS[kind]})",
            str(traffic.size),
            str(traffic.count),
            Text(crossing, style=style),
            _abbrev(plan.groups[kind][0]),
        )
    if table.row_count == 0:
        table.add_row("(single rank groups only)", "1", str(plan.world_size), "0", "")
    return table


def _segments(plan: Plan) -> Table | None:
    """On a block site: the segments Slurm is asked for, and which groups stay inside an NVLink domain."""
    seg = plan.segments
    if seg is None:
        return None
    table = Table(title="NVLink domains (blocks)", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    spare = f" + {seg.spares_each} spare" if seg.spares_each else ""
    how = f"sbatch --segment={seg.sbatch_size}" if seg.rendered else f"no --segment: Slurm {plan.site.slurm_version} lacks it"
    table.add_row("segments", f"{seg.count} x ({seg.size} nodes{spare}), each inside one block ({how})")
    kept = ", ".join(f"{kind} ({nodes} node{'s' if nodes > 1 else ''} each)" for kind, nodes in seg.spans.items())
    table.add_row("kept inside", kept or "none (topology.segment asked)")
    if seg.inside:
        table.add_row("also inside", ", ".join(seg.inside))
    table.add_row("across domains", ", ".join(seg.crossing) or "none")
    if seg.spares_each:
        table.add_row("spares", "a spare replaces a node of its own block only")
    return table


def _rails(plan: Plan) -> Table:
    table = Table(title="Data-parallel traffic by rail", title_justify="left")
    table.add_column("rails used")
    table.add_column("dp groups", justify="right")
    table.add_column("meaning")
    if plan.traffic["dp"].cross_node == 0:
        table.add_row("-", str(plan.traffic["dp"].count), "every dp group stays inside one node")
        return table
    single = sorted({r[0] for r in plan.dp_rails if len(r) == 1})
    aligned = sum(1 for r in plan.dp_rails if len(r) == 1)
    if aligned:
        table.add_row(_rail_list(single), str(aligned), "rail-aligned: each group's all-reduce stays on its rail")
    mixed = Counter(tuple(r) for r in plan.dp_rails if len(r) != 1)
    for rails, count in sorted(mixed.items()):
        meaning = "no NIC on a rail" if not rails else "mixed rails: traffic crosses the spine"
        table.add_row(_rail_list(list(rails)) if rails else "none", str(count), meaning)
    return table


def _rail_list(rails: list[int]) -> str:
    if len(rails) > 2 and rails == list(range(rails[0], rails[-1] + 1)):
        return f"{rails[0]}-{rails[-1]} (one each)"
    return ", ".join(map(str, rails))


def _batch(plan: Plan) -> Table:
    b = plan.batch
    table = Table(title="Batch", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("global batch", f"{b.micro} micro x {b.grad_accum} accum x {b.dp} dp = {b.global_batch} sequences")
    table.add_row("tokens per step", f"{b.tokens_per_step:,} ({plan.spec.seq_len} per sequence)")
    table.add_row(
        "pipeline bubble",
        f"{plan.bubble:.1%} of the step  ((pp-1)/(vpp*accum+pp-1) = "
        f"{plan.dims.layout.pp - 1}/({plan.dims.vpp}*{b.grad_accum}+{plan.dims.layout.pp - 1}))",
    )
    return table


def _memory(plan: Plan) -> Table | Text:
    mem = plan.memory
    if mem is None:
        return Text("Memory: no model given (add model.params or the model shape for an estimate)", style="dim")
    table = Table(title="Memory per GPU (estimate)", title_justify="left")
    table.add_column("category")
    table.add_column("bytes", justify="right")
    table.add_column("share of GPU", justify="right")
    rows = [
        ("parameters", mem.params),
        ("gradients", mem.grads),
        ("optimizer state", mem.optimizer),
        ("activations", mem.activations),
    ]
    for label, value in rows:
        if value is None:
            table.add_row(label, "unknown (no model shape)", "")
        else:
            table.add_row(label, format_gb(value), f"{value / mem.capacity:.1%}")
    table.add_row("total", format_gb(mem.total), f"{mem.total / mem.capacity:.1%}", style="bold")
    table.add_row("headroom", format_gb(mem.headroom), f"{mem.headroom / mem.capacity:.1%}")
    table.caption = f"{plan.node_type.gpu_model}: {mem.capacity / 1e9:g} GB; {mem.params_per_gpu:,} parameters per GPU"
    return table


def _checkpoint(plan: Plan) -> Table | Text:
    advice = plan.checkpoint
    if advice is None:
        return Text("Checkpoint interval: give the model (or checkpoint.save_seconds) for a Young/Daly estimate", style="dim")
    table = Table(title="Checkpoint interval (Young/Daly: sqrt(2 x save x MTBF))", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    how = "estimated from the state size and the site's write bandwidth" if advice.save_estimated else "measured"
    table.add_row("save cost", f"{format_duration(advice.save_s)} ({how})")
    table.add_row("job MTBF", format_duration(advice.mtbf_s))
    table.add_row("suggested interval", format_duration(advice.interval_s))
    table.add_row("expected time lost", f"{advice.lost_fraction:.2%} (saving + work redone after failures)")
    configured = plan.spec.checkpoint.interval
    table.add_row("configured", "auto (the suggestion, in steps of the measured step time)" if configured == "auto" else f"every {configured} steps")
    if plan.snapshots is not None and plan.memory_interval:
        auto = " (auto)" if plan.spec.checkpoint.memory_interval == "auto" else ""
        every = "every step" if plan.memory_interval == 1 else f"every {plan.memory_interval} steps"
        table.add_row("in memory", f"{every}{auto}: {plan.snapshots.describe()}")
    return table


def _elastic(plan: Plan) -> Table | None:
    """The widths an elastic job may shrink to, largest first (plan/elastic.py)."""
    found = plan.elastic
    if found is None:
        return None
    kept = "the global batch kept exact" if found.batch == "keep" else "the global batch follows dp"
    table = Table(title=f"Elastic: widths down to {found.min_nodes} nodes ({kept}; grow back: {'yes' if found.grow else 'no'})",
                  title_justify="left")
    for column in ("nodes", "dp", "micro x accum", "global batch", "memory per GPU"):
        table.add_column(column, justify="right")
    full = plan.batch
    table.add_row(str(plan.nodes), str(full.dp), f"{full.micro} x {full.grad_accum}", str(full.global_batch),
                  format_gb(plan.memory.total) if plan.memory else "-", style="dim")
    for w in found.widths:
        table.add_row(str(w.nodes), str(w.dp), f"{w.micro} x {w.grad_accum}", str(w.global_batch),
                      format_gb(w.memory_gb * 1e9) if w.memory_gb is not None else "-")
    if found.skipped:
        table.caption = f"not used: {grouped(found.skipped)}"
    return table


def verdict_line(plan: Plan) -> Text | None:
    """The FITS / DOES NOT FIT line, with the reason for the margin."""
    mem = plan.memory
    if mem is None:
        return None
    text = Text("memory verdict: ")
    text.append("FITS" if mem.fits else "DOES NOT FIT", style="bold green" if mem.fits else "bold red")
    text.append(
        f"  ({format_gb(mem.total)} of {format_gb(mem.capacity)};"
        f" {RESERVE_NOTE}: {format_gb(mem.reserve)})"
    )
    return text


RESERVE_NOTE = "10% kept free for CUDA context, NCCL buffers and fragmentation"


def render_plan(plan: Plan, console: Console) -> None:
    parts = [_summary(plan), _rank_map(plan), _groups(plan), _segments(plan), _rails(plan), _batch(plan), _memory(plan),
             _checkpoint(plan), _elastic(plan)]
    parts = [part for part in parts if part is not None]
    console.print(Group(*parts))
    verdict = verdict_line(plan)
    if verdict is not None:
        console.print(verdict)
    for warning in plan.warnings:
        console.print(Text.assemble(("warning: ", "yellow"), warning))
