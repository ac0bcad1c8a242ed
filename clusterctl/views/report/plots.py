"""The report's PNG plots, drawn with matplotlib's Agg backend (no display needed).

matplotlib is the optional `report` extra: `require()` imports it and says
how to install it when it is missing. Every plot is always written; one
without data says what is missing instead, so the page never has a hole.
Long series are binned to screen resolution before drawing (stats.binned).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.views.report.load import RunData
from clusterctl.views.report.stats import WARMUP_STEPS, Figures, binned
from clusterctl.views.report.timeline import CATEGORIES

FILES = ("loss.png", "step_time.png", "heatmap.png", "throughput.png", "attempts.png", "phases.png")
DPI = 100
INSTALL_HINT = "pip install 'clusterctl[report]'"
PHASE_COLOURS = {"compute": "#4c72b0", "collective": "#dd8452", "save": "#8172b3", "eval": "#55a868",
                 "idle": "#c7c7c7", "load": "#da8bc3", "other": "#937860"}


def require() -> Any:
    """matplotlib.pyplot on the Agg backend, or a ClusterctlError (exit 69) that names the install command."""
    try:
        import matplotlib  # noqa: PLC0415 - optional dependency

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise ClusterctlError(
            f"the report's plots need matplotlib, which is not installed ({exc}): {INSTALL_HINT}",
            ExitCode.BACKEND_UNAVAILABLE,
        ) from None
    return plt


def _clock(data: RunData) -> tuple[float, float, str]:
    """(origin, divisor, unit) for wall-clock axes: elapsed time since the first attempt began."""
    starts = [a.start for a in data.attempts if a.start is not None]
    ts = [float(a.metrics.t[0]) for a in data.attempts if a.metrics.t.size]
    ends = [float(a.metrics.t[-1]) for a in data.attempts if a.metrics.t.size]
    ends += [a.end for a in data.attempts if a.end is not None]
    origin = min(starts + ts) if starts or ts else 0.0
    span = (max(ends) - origin) if ends else 0.0
    if span > 3 * 3600:
        return origin, 3600.0, "h"
    if span > 180:
        return origin, 60.0, "min"
    return origin, 1.0, "s"


def _placeholder(plt: Any, path: Path, title: str, why: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 2.2), dpi=DPI, layout="constrained")
    ax.axis("off")
    ax.text(0.5, 0.62, title, ha="center", va="center", fontsize=13, weight="bold", transform=ax.transAxes)
    ax.text(0.5, 0.3, why, ha="center", va="center", fontsize=11, color="#555555", transform=ax.transAxes, wrap=True)
    fig.savefig(path)
    plt.close(fig)


def _attempt_colour(i: int) -> str:
    palette = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f")
    return palette[i % len(palette)]


def _mark(ax: Any, x: float, label: str) -> None:
    ax.axvline(x, color="#d62728", linestyle="--", linewidth=1.1, alpha=0.8)
    ax.annotate(label, xy=(x, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -3), textcoords="offset points",
                ha="left", va="top", fontsize=9, color="#d62728")


def plot_loss(plt: Any, data: RunData, path: Path) -> None:
    with_steps = [a for a in data.attempts if a.metrics.step.size]
    if not with_steps:
        _placeholder(plt, path, "Loss", "no metrics.jsonl records: the run has not trained")
        return
    origin, div, unit = _clock(data)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.5), dpi=DPI, layout="constrained")
    for i, a in enumerate(with_steps):
        m, colour = a.metrics, _attempt_colour(i)
        for ax, x in ((top, m.step.astype(float)), (bottom, (m.t - origin) / div)):
            bx, mean, lo, hi = binned(x, m.loss)
            ax.plot(bx, mean, color=colour, linewidth=1.2, label=f"training loss, attempt {a.number}")
            if bx.size and (hi > lo).any():
                ax.fill_between(bx, lo, hi, color=colour, alpha=0.18, linewidth=0)
            val = np.isfinite(m.val_loss)
            if val.any():
                ax.plot(x[val], m.val_loss[val], "o", color="#ff7f0e", markersize=4, markeredgecolor="black",
                        markeredgewidth=0.4, label="validation loss" if i == 0 else None)
        _mark(top, float(m.step[0]), f"attempt {a.number}")
        _mark(bottom, ((a.start if a.start is not None else float(m.t[0])) - origin) / div, f"attempt {a.number}")
    top.set_xlabel("step")
    bottom.set_xlabel(f"wall-clock time since the first attempt began ({unit})")
    for ax in (top, bottom):
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=9)
    top.set_title("Loss against step (above) and wall-clock time (below); dashed: an attempt began")
    fig.savefig(path)
    plt.close(fig)


def plot_step_time(plt: Any, fig_data: Figures, path: Path) -> None:
    st = fig_data.steps
    if st is None:
        _placeholder(plt, path, "Step time per rank", "no step records in timeline.jsonl")
        return
    n = st.ranks.size
    x = np.arange(n)
    width = min(11.0, max(8.0, 0.25 * n + 4))
    fig, ax = plt.subplots(figsize=(width, 5.2), dpi=DPI, layout="constrained")
    have = np.isfinite(st.p50)
    lows = np.array([s.min() if s.size else np.nan for s in st.steady])
    median = float(np.median(st.p50[have])) if have.any() else np.nan
    slow = have & (st.p50 > 1.2 * median)
    colours = np.where(slow, "#d62728", "#1f77b4")
    lw = max(2.0, min(14.0, 300.0 / max(n, 1)))
    ax.vlines(x[have], lows[have], st.max[have], colors=colours[have], linewidth=1.0, label="steady: full range (min to max)")
    ax.vlines(x[have], st.p50[have], st.p90[have], colors=colours[have], linewidth=lw, alpha=0.55, label="steady: p50 to p90")
    ax.scatter(x[have], st.p50[have], color="white", edgecolors=colours[have], zorder=3, s=28, label="steady: p50")
    ax.scatter(x[have], st.max[have], marker="_", color=colours[have], zorder=3, s=120, label="steady: max")
    wx = np.concatenate([np.full(w.size, i + 0.28) for i, w in enumerate(st.warmup)]) if n else np.zeros(0)
    wy = np.concatenate(st.warmup) if n else np.zeros(0)
    if wy.size:
        ax.scatter(wx, wy, marker="x", color="#ff7f0e", s=18, zorder=2,
                   label=f"warm-up: first {WARMUP_STEPS} steps of each attempt")
    allv = np.concatenate([v for v in (lows[have], st.max[have], wy) if v.size]) if n else np.zeros(0)
    allv = allv[np.isfinite(allv) & (allv > 0)]
    if allv.size and allv.max() / allv.min() > 8:
        ax.set_yscale("log")
    flagged = np.flatnonzero(slow)[np.argsort(-st.p50[slow])][:4]
    if flagged.size:
        lines = [f"rank {int(st.ranks[i])}: p50 {st.p50[i]:.3g} s, {st.p50[i] / median:.2f}x the median rank" for i in flagged]
        if slow.sum() > flagged.size:
            lines.append(f"... and {int(slow.sum()) - flagged.size} more ranks above 1.2x (red)")
        ax.text(0.99, 0.98, "\n".join(lines), transform=ax.transAxes, ha="right", va="top", fontsize=9, color="#d62728",
                bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#d62728"})
    step = max(1, n // 32)
    ax.set_xticks(x[::step])
    ax.set_xticklabels([str(int(r)) for r in st.ranks[::step]])
    ax.set_xlim(-0.7, n - 0.3)
    ax.set_xlabel("rank")
    ax.set_ylabel("step time (s)")
    ax.set_title("Step time per rank (steady interval; warm-up apart; outliers kept)")
    ax.grid(alpha=0.3, axis="y")
    fig.legend(loc="outside lower center", fontsize=8.5, ncol=3, frameon=False)
    fig.savefig(path)
    plt.close(fig)


def plot_heatmap(plt: Any, fig_data: Figures, path: Path) -> None:
    hm = fig_data.heatmap
    if hm is None:
        _placeholder(plt, path, "Step time by rank and step", "no step records in timeline.jsonl")
        return
    import matplotlib  # noqa: PLC0415

    rows, cols = hm.matrix.shape
    fig, ax = plt.subplots(figsize=(11, max(3.0, min(8.0, 1.6 + 0.3 * rows))), dpi=DPI, layout="constrained")
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")
    with np.errstate(all="ignore"):
        row_median = np.nanmedian(hm.matrix, axis=1)
        row_low = np.nanpercentile(hm.matrix, 5, axis=1)
        row_p90 = np.nanpercentile(hm.matrix, 90, axis=1)
    # Colours up to the slowest row's typical step and a bit (rare outliers saturate rather than wash out the rows)
    vmax = max(float(np.nanmax(row_median)) * 1.25, float(np.nanmax(row_p90))) if np.isfinite(row_median).any() else None
    vmin = float(np.nanmin(row_low)) if np.isfinite(row_low).any() else None
    if vmin is not None and vmax is not None and vmin >= vmax:
        vmin = None
    r_hi = hm.rank_lo + rows * hm.ranks_per_row
    image = ax.imshow(hm.matrix, aspect="auto", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax,
                      extent=(hm.step_lo, hm.step_hi, r_hi - 0.5, hm.rank_lo - 0.5))
    per_bin = max(1, (hm.step_hi - hm.step_lo) // cols)
    bar = fig.colorbar(image, ax=ax, extend="max", pad=0.01)
    bar.set_label("step time (s), max per bin" + ("" if per_bin == 1 else f" of {per_bin} steps"))
    if rows <= 32 and hm.ranks_per_row == 1:
        ax.set_yticks(np.arange(hm.rank_lo, r_hi))
    ax.set_ylabel("rank" if hm.ranks_per_row == 1 else f"rank ({hm.ranks_per_row} ranks per row, max)")
    ax.set_xlabel("step")
    ax.set_title("Step time by rank and step (a straggler is a bright row; grey: no record)")
    fig.savefig(path)
    plt.close(fig)


def _thousands(plt: Any) -> Any:
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    def fmt(v: float, _pos: Any) -> str:
        if abs(v) >= 1e6:
            return f"{v / 1e6:g}M"
        if abs(v) >= 1e3:
            return f"{v / 1e3:g}k"
        return f"{v:g}"

    return FuncFormatter(fmt)


def plot_throughput(plt: Any, data: RunData, path: Path) -> None:
    with_steps = [a for a in data.attempts if a.metrics.step.size and np.isfinite(a.metrics.tokens_per_s).any()]
    if not with_steps:
        _placeholder(plt, path, "Throughput", "no metrics.jsonl records with tokens_per_s")
        return
    origin, div, unit = _clock(data)
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=DPI, layout="constrained")
    for i, a in enumerate(with_steps):
        m, colour = a.metrics, _attempt_colour(i)
        bx, mean, lo, hi = binned((m.t - origin) / div, m.tokens_per_s)
        ax.plot(bx, mean, color=colour, linewidth=1.2, label=f"attempt {a.number}")
        if bx.size and (hi > lo).any():
            ax.fill_between(bx, lo, hi, color=colour, alpha=0.18, linewidth=0)
        _mark(ax, ((a.start if a.start is not None else float(m.t[0])) - origin) / div, f"attempt {a.number}")
    ax.yaxis.set_major_formatter(_thousands(plt))
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"wall-clock time since the first attempt began ({unit})")
    ax.set_ylabel("tokens/s")
    ax.set_title("Throughput (mean per bin; band: min to max)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.savefig(path)
    plt.close(fig)


GANTT = {"queue": ("#b0b0b0", "queue wait"), "gap": ("#f4a6a6", "restart gap"), "startup": ("#f2c14e", "start-up"),
         "train": ("#59a14f", "training"), "save": ("#7b4fa8", "checkpoint save"), "ending": ("#8cb3d9", "last step to end")}


def plot_attempts(plt: Any, data: RunData, fig_data: Figures, path: Path, submitted: float | None) -> None:
    if not data.attempts:
        _placeholder(plt, path, "Attempts", "no attempt has started")
        return
    from matplotlib.patches import Patch  # noqa: PLC0415

    origin, div, unit = _clock(data)
    n = len(data.attempts)
    fig, ax = plt.subplots(figsize=(11, max(2.8, 1.3 + 0.7 * n)), dpi=DPI, layout="constrained")

    def bar(y: float, lo: float | None, hi: float | None, kind: str, height: float = 0.5, **kw: Any) -> None:
        if lo is None or hi is None or hi <= lo:
            return
        ax.broken_barh([((lo - origin) / div, (hi - lo) / div)], (y - height / 2, height), facecolors=GANTT[kind][0], **kw)

    prev = None
    for i, a in enumerate(data.attempts):
        y = n - 1 - i
        if a.start is not None:
            if i == 0 and submitted is not None and submitted <= a.start:
                bar(y, submitted, a.start, "queue")
            elif prev is not None and prev.next_how in ("continuation", "requeue", "slurm"):
                bar(y, prev.next_time or prev.end, a.start, "queue")
            elif prev is not None and prev.end is not None:
                bar(y, prev.end, a.start, "gap", hatch="//", edgecolor="#d62728", linewidth=0)
        first = fig_data.first_step_at[i]
        last = float(a.metrics.t[-1]) if a.metrics.t.size else None
        bar(y, a.start, first if first is not None else a.end, "startup")
        bar(y, first, last, "train")
        saves = fig_data.saves[i] if i < len(fig_data.saves) else []
        if saves:
            ax.broken_barh([((s - origin) / div, d / div) for s, d in saves], (y - 0.25, 0.5), facecolors=GANTT["save"][0])
        bar(y, last, a.end, "ending")
        v = a.verdict or {}
        code = a.exit_code if a.exit_code is not None else v.get("code")
        ok = bool(v.get("ok")) if "ok" in v else code in (0, None)
        words = str(v.get("message") or a.end_reason or ("running" if a.end is None else ""))
        label = (f"exit {code}: " if code is not None else "") + (words[:90] + ("..." if len(words) > 90 else ""))
        if a.next_how:
            label += f"  \u2192 next: {a.next_how}"
        x0 = min((t for t in (a.start, first, last, a.end) if t is not None), default=origin)
        ax.text((x0 - origin) / div, y + 0.3, label, va="bottom", ha="left", fontsize=8.5,
                color="#2ca02c" if ok else "#d62728", clip_on=False)
        prev = a
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"attempt {a.number}\njob {a.job_id or '?'}" for a in reversed(data.attempts)], fontsize=9)
    ax.set_ylim(-0.6, n - 0.2)
    ax.set_xlabel(f"wall-clock time since the first attempt began ({unit})")
    ax.set_title("Attempts: where the wall-clock time went (text: exit code, verdict, how the run went on)", fontsize=11)
    handles = [Patch(facecolor=c, label=label, hatch="//" if k == "gap" else None, edgecolor="#d62728" if k == "gap" else c)
               for k, (c, label) in GANTT.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=6, fontsize=8.5, frameon=False)
    ax.grid(alpha=0.3, axis="x")
    fig.savefig(path)
    plt.close(fig)


def plot_phases(plt: Any, fig_data: Figures, path: Path) -> None:
    table, ranks = fig_data.phases, fig_data.phase_ranks
    if ranks.size == 0 or not np.any(table):
        _placeholder(plt, path, "Time per phase and rank", "no phase records in timeline.jsonl")
        return
    n = ranks.size
    fig, ax = plt.subplots(figsize=(11, max(3.0, min(12.0, 1.5 + 0.32 * n))), dpi=DPI, layout="constrained")
    y = np.arange(n)
    left = np.zeros(n)
    for j, cat in enumerate(CATEGORIES):
        width = table[:, j]
        if not width.any():
            continue
        label = "compute (forward, backward, optimizer)" if cat == "compute" else ("other (start)" if cat == "other" else cat)
        ax.barh(y, width, left=left, color=PHASE_COLOURS[cat], label=label, height=0.7)
        left += width
    step = max(1, n // 40)
    ax.set_yticks(y[::step])
    ax.set_yticklabels([str(int(r)) for r in ranks[::step]])
    ax.invert_yaxis()
    ax.set_ylabel("rank")
    ax.set_xlabel("seconds (all attempts)")
    ax.set_title("Time per phase and rank")
    ax.grid(alpha=0.3, axis="x")
    fig.legend(loc="outside lower center", ncol=6, fontsize=9, frameon=False)
    fig.savefig(path)
    plt.close(fig)


def draw_all(data: RunData, fig_data: Figures, out: Path, submitted: float | None = None) -> list[str]:
    """Write every plot into `out`; returns the file names written."""
    plt = require()
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11.5})
    plot_loss(plt, data, out / "loss.png")
    plot_step_time(plt, fig_data, out / "step_time.png")
    plot_heatmap(plt, fig_data, out / "heatmap.png")
    plot_throughput(plt, data, out / "throughput.png")
    plot_attempts(plt, data, fig_data, out / "attempts.png", submitted)
    plot_phases(plt, fig_data, out / "phases.png")
    return list(FILES)
