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
from clusterctl.views.report.stats import WARMUP_STEPS, Figures, VerdictMark, binned
from clusterctl.views.report.timeline import CATEGORIES

FILES = ("loss.png", "step_time.png", "heatmap.png", "throughput.png", "attempts.png", "phases.png")
DPI = 100
INSTALL_HINT = "pip install matplotlib (the `report` extra: pip install -e '.[report]' from the checkout)"
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


def _mark(ax: Any, x: float, label: str, colour: str = "#7f7f7f") -> None:
    ax.axvline(x, color=colour, linestyle="--", linewidth=1.1, alpha=0.8)
    ax.annotate(label, xy=(x, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -3), textcoords="offset points",
                ha="left", va="top", fontsize=9, color=colour)


VERDICT_COLOUR = "#d62728"


LABEL_GAP = 0.12  # of the axis' width: verdict labels closer than this go on the next row up
LABEL_ROW_PT = 12  # points between rows of verdict labels


def label_rows(xs: list[float], span: float) -> list[int]:
    """The row (0 at the bottom) of each label at `xs`, so that no two on a row are closer than LABEL_GAP * span:
    verdicts seconds apart would print over each other ("verdict 84: verdict 83: ran...")."""
    rows: list[int] = []
    last: list[float] = []  # the rightmost label's x on each row
    for x in xs:
        row = next((r for r, at in enumerate(last) if x - at >= LABEL_GAP * span), len(last))
        if row == len(last):
            last.append(x)
        last[row] = x
        rows.append(row)
    return rows


def _verdict_lines(ax: Any, placed: list[tuple[float, VerdictMark]]) -> None:
    placed = sorted(placed, key=lambda p: p[0])
    lo, hi = ax.get_xlim()
    for (x, v), row in zip(placed, label_rows([x for x, _ in placed], max(hi - lo, 1e-9))):
        _verdict_line(ax, x, v, row)


def _verdicts_on_time(ax: Any, marks: list[VerdictMark], origin: float, div: float) -> None:
    """Each failed verdict as a red line at its time, labelled with its code and the blamed rank."""
    _verdict_lines(ax, [((v.t - origin) / div, v) for v in marks if v.t is not None])


def _verdicts_on_steps(ax: Any, marks: list[VerdictMark]) -> None:
    _verdict_lines(ax, [(float(v.step), v) for v in marks if v.step is not None])


def _verdict_line(ax: Any, x: float, v: VerdictMark, row: int = 0) -> None:
    ax.axvline(x, color=VERDICT_COLOUR, linewidth=1.6, alpha=0.9)
    ax.annotate(f"verdict {v.label}", xy=(x, 0.0), xycoords=("data", "axes fraction"), xytext=(3, 3 + row * LABEL_ROW_PT),
                textcoords="offset points", ha="left", va="bottom", fontsize=9, color=VERDICT_COLOUR, weight="bold",
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1})


def _blamed_ranks(marks: list[VerdictMark]) -> dict[int, str]:
    """rank -> the verdicts that blamed it ("83", "82, 84")."""
    found: dict[int, list[str]] = {}
    for v in marks:
        for r in v.ranks:
            found.setdefault(r, []).append(str(v.code))
    return {r: ", ".join(codes) for r, codes in found.items()}


def _seconds(plt: Any) -> Any:
    """Tick labels in plain seconds or milliseconds (never 6x10^-1)."""
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    def fmt(v: float, _pos: Any) -> str:
        if v <= 0:
            return "0"
        return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"

    return FuncFormatter(fmt)


LOG_LOSS_RANGE = 10.0  # the loss's top over its low tail beyond which the axis is logarithmic


def loss_scale(loss: np.ndarray) -> str:
    """"log" where the loss spans more than LOG_LOSS_RANGE (its max over its 10th percentile) and is positive
    throughout, else "linear"."""
    finite = loss[np.isfinite(loss)]
    if finite.size < 2 or (finite <= 0).any():
        return "linear"
    return "log" if finite.max() / np.percentile(finite, 10) > LOG_LOSS_RANGE else "linear"


def plot_loss(plt: Any, data: RunData, path: Path, marks: list[VerdictMark] | None = None) -> None:
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
    _verdicts_on_steps(top, marks or [])
    _verdicts_on_time(bottom, marks or [], origin, div)
    top.set_xlabel("step")
    bottom.set_xlabel(f"wall-clock time since the first attempt began ({unit})")
    scale = loss_scale(np.concatenate([a.metrics.loss for a in with_steps]))
    for ax in (top, bottom):
        ax.set_yscale(scale)  # early spikes on a linear axis flatten every later attempt
        ax.set_ylabel("loss" + (" (log scale)" if scale == "log" else ""))
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=9)
    top.set_title("Loss against step (above) and wall-clock time (below); dashed: an attempt began; red: a verdict")
    fig.savefig(path)
    plt.close(fig)


MANY_RANKS = 64  # above this, step_time.png draws bands across the ranks rather than a bar per rank


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
    wy = np.zeros(0)
    if n <= MANY_RANKS:  # each rank its own bar, its warm-up steps beside it
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
    else:  # hundreds of ranks: bands across the ranks, the slow ones as points; warm-up left out
        ax.fill_between(x, lows, st.max, color="#1f77b4", alpha=0.15, linewidth=0, step="mid", label="steady: min to max")
        ax.fill_between(x, st.p50, st.p90, color="#1f77b4", alpha=0.45, linewidth=0, step="mid", label="steady: p50 to p90")
        ax.plot(x, st.p50, color="#1f77b4", linewidth=0.8, drawstyle="steps-mid", label="steady: p50")
        ax.scatter(x[slow], st.p50[slow], color="#d62728", zorder=3, s=22, label="p50 above 1.2x the median rank")
    allv = np.concatenate([v for v in (lows[have], st.max[have], wy) if v.size]) if n else np.zeros(0)
    allv = allv[np.isfinite(allv) & (allv > 0)]
    if allv.size and allv.max() / allv.min() > 8:
        ax.set_yscale("log")
        from matplotlib.ticker import NullFormatter  # noqa: PLC0415

        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(_seconds(plt))
    for rank, codes in _blamed_ranks(fig_data.verdicts).items():
        where = np.flatnonzero(st.ranks == rank)
        if where.size:
            ax.annotate(f"blamed: {codes}", xy=(float(where[0]), 1.0), xycoords=("data", "axes fraction"), xytext=(0, -3),
                        textcoords="offset points", ha="center", va="top", fontsize=9, color=VERDICT_COLOUR, weight="bold")
    flagged = np.flatnonzero(slow)[np.argsort(-st.p50[slow])][:4]
    if flagged.size:
        lines = [f"rank {int(st.ranks[i])}: p50 {_seconds(plt)(st.p50[i], None)}, {st.p50[i] / median:.2f}x the median rank"
                 for i in flagged]
        if slow.sum() > flagged.size:
            lines.append(f"... and {int(slow.sum()) - flagged.size} more ranks above 1.2x (red)")
        ax.text(0.99, 0.98, "\n".join(lines), transform=ax.transAxes, ha="right", va="top", fontsize=9, color="#d62728",
                bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#d62728"})
    step = max(1, -(-n // 32))  # at most 32 labels: readable at 8 ranks and at 512
    ax.set_xticks(x[::step])
    ax.set_xticklabels([str(int(r)) for r in st.ranks[::step]], rotation=90 if n > 64 else 0)
    ax.set_xlim(-0.7, n - 0.3)
    ax.set_xlabel("rank")
    ax.set_ylabel("step time")
    ax.set_title("Step time per rank (steady interval; " + ("warm-up apart" if n <= MANY_RANKS else "warm-up left out")
                 + "; outliers kept)")
    ax.grid(alpha=0.3, axis="y")
    fig.legend(loc="outside lower center", fontsize=8.5, ncol=3, frameon=False)
    fig.savefig(path)
    plt.close(fig)


HEATMAP_SCALE = (1.0, 2.0)  # compute time over the step's median: at or below it dark, twice it (or more) brightest


def plot_heatmap(plt: Any, fig_data: Figures, path: Path) -> None:
    hm = fig_data.heatmap
    if hm is None:
        _placeholder(plt, path, "Compute time by rank and step", "no step records in timeline.jsonl")
        return
    import matplotlib  # noqa: PLC0415

    rows, cols = hm.matrix.shape
    fig, ax = plt.subplots(figsize=(11, max(3.0, min(8.0, 1.6 + 0.3 * rows))), dpi=DPI, layout="constrained")
    cmap = matplotlib.colormaps["inferno"].with_extremes(bad="#d9d9d9")
    r_hi = hm.rank_lo + rows * hm.ranks_per_row
    # A fixed scale, the same for every run: a healthy run's noise stays dark, a 1.5x straggler is half-way up.
    image = ax.imshow(hm.matrix, aspect="auto", interpolation="nearest", cmap=cmap, vmin=HEATMAP_SCALE[0],
                      vmax=HEATMAP_SCALE[1], extent=(0, hm.width, r_hi - 0.5, hm.rank_lo - 0.5))
    per_bin = max(1, hm.width // cols)
    bar = fig.colorbar(image, ax=ax, extend="both", pad=0.01, ticks=[1.0, 1.25, 1.5, 1.75, 2.0])
    bar.ax.set_yticklabels(["\u2264 1x", "1.25x", "1.5x", "1.75x", "\u2265 2x"])
    bar.set_label("compute \u00f7 the step's median" + ("" if per_bin == 1 else f", max of {per_bin} steps"))
    if rows <= 32 and hm.ranks_per_row == 1:
        ax.set_yticks(np.arange(hm.rank_lo, r_hi))
    for rank, codes in _blamed_ranks(fig_data.verdicts).items():
        ax.annotate(f"\u25c0 blamed: {codes}", xy=(1.0, rank), xycoords=("axes fraction", "data"), xytext=(4, 0),
                    textcoords="offset points", ha="left", va="center", fontsize=9, color=VERDICT_COLOUR, weight="bold",
                    annotation_clip=False)
    for i, (number, x0, first, last) in enumerate(hm.spans):  # attempts side by side, each labelled with its steps
        if x0 > 0:
            ax.axvline(x0, color="#7f7f7f", linestyle="--", linewidth=1.0)
        ax.annotate(f"attempt {number}: steps {first}-{last}", xy=(x0, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, 2 + 11 * (i % 2)), textcoords="offset points", ha="left", va="bottom", fontsize=8.5,
                    color="#555555")  # staggered: a short attempt's label does not hide the next one's
    for v in fig_data.verdicts:
        x = hm.x_of(v.attempt, v.step) if v.step is not None else None
        if x is not None:
            _verdict_line(ax, x, v)
    ax.set_xticks([])
    ax.set_ylabel("rank" if hm.ranks_per_row == 1 else f"rank ({hm.ranks_per_row} ranks per row, max)")
    ax.set_xlabel("steps, attempt after attempt (a failed attempt is followed by a grey gap: no rank reported)")
    ax.set_title("Compute time relative to the step's median (a straggler: a bright row; grey: no record)", pad=26)
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


ROLLING_STEPS = 25  # the throughput line's rolling window, at most
STALL_S = 10.0  # no step ended for this long (and ten steps' time): throughput drops to zero there


def rolling(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rolling median, min and max over the last `window` values (fewer at the start)."""
    n = values.size
    if n == 0 or window <= 1:
        return values, values, values
    padded = np.concatenate([np.full(window - 1, np.nan), values])
    view = np.lib.stride_tricks.sliding_window_view(padded, window)
    with np.errstate(all="ignore"):
        import warnings  # noqa: PLC0415

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmedian(view, axis=1), np.nanmin(view, axis=1), np.nanmax(view, axis=1)


def with_drops(t: np.ndarray, step_s: np.ndarray, series: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Zeros inserted where no step ended for much longer than a step takes (a hang, a stall): the line drops to
    zero there and comes back, rather than drawing a ramp across the gap."""
    if t.size < 2:
        return t, series
    typical = float(np.nanmedian(step_s)) if np.isfinite(step_s).any() else float(np.median(np.diff(t)))
    gap = np.flatnonzero(np.diff(t) > max(10 * typical, STALL_S))  # not a save or an evaluation: those are short
    if gap.size == 0:
        return t, series
    at = np.concatenate([t[gap] + typical, t[gap + 1] - np.where(np.isfinite(step_s[gap + 1]), step_s[gap + 1], typical)])
    order = np.argsort(np.concatenate([t, at]), kind="stable")
    t2 = np.concatenate([t, at])[order]
    return t2, [np.concatenate([s, np.zeros(at.size)])[order] for s in series]


def plot_throughput(plt: Any, data: RunData, path: Path, marks: list[VerdictMark] | None = None) -> None:
    tokens = any(a.metrics.step.size and np.isfinite(a.metrics.tokens_per_s).any() for a in data.attempts)
    with_steps = [a for a in data.attempts if a.metrics.step.size
                  and (np.isfinite(a.metrics.tokens_per_s).any() if tokens else np.isfinite(a.metrics.step_s).any())]
    if not with_steps:
        _placeholder(plt, path, "Throughput", "no metrics.jsonl records with tokens_per_s or step_s")
        return
    origin, div, unit = _clock(data)
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=DPI, layout="constrained")
    for i, a in enumerate(with_steps):
        m, colour = a.metrics, _attempt_colour(i)
        window = max(1, min(ROLLING_STEPS, m.step.size // 10))
        with np.errstate(divide="ignore", invalid="ignore"):  # a script that records no tokens: steps per second
            rate = m.tokens_per_s if tokens else np.where(m.step_s > 0, 1.0 / m.step_s, np.nan)
        med, lo, hi = rolling(rate, window)
        t, (med, lo, hi) = with_drops(m.t, m.step_s, [med, lo, hi])
        x = (t - origin) / div
        bx, mean, _, _ = binned(x, med)
        _, _, band_lo, _ = binned(x, lo)
        _, _, _, band_hi = binned(x, hi)
        ax.fill_between(bx, band_lo, band_hi, color=colour, alpha=0.2, linewidth=0,
                        label=f"min to max over {window} steps" if i == 0 else None)
        ax.plot(bx, mean, color=colour, linewidth=1.3, label=f"attempt {a.number}: median over {window} steps")
        _mark(ax, ((a.start if a.start is not None else float(m.t[0])) - origin) / div, f"attempt {a.number}")
    _verdicts_on_time(ax, marks or [], origin, div)
    ax.yaxis.set_major_formatter(_thousands(plt))
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"wall-clock time since the first attempt began ({unit})")
    ax.set_ylabel("tokens/s" if tokens else "steps/s (the script records no tokens)")
    ax.set_title("Throughput: rolling median, band from min to max; a hang or a stall drops to zero")
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
    data_end = max((t for a in data.attempts for t in (a.start, a.end, *a.metrics.t[-1:]) if t is not None), default=origin)
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
        v = a.verdict
        code = a.exit_code if a.exit_code is not None else v.code if v is not None else None
        failed_verdict = v is not None and not v.ok and code != ExitCode.CANCELLED
        ok = code in (0, ExitCode.PRE_TIMEOUT, ExitCode.CANCELLED, None) and not failed_verdict  # a planned stop, a cancel
        # Why it ended: a failed verdict's words; else how its history says it ended (a cancel, a pre-timeout
        # stop), never the start-up check's "all ranks registered" of an attempt that was then cancelled.
        words = str(v.message if v is not None and failed_verdict else (a.meaning or a.end_reason or ("running" if a.end is None else "")))
        label = (f"exit {code}: " if code is not None else "") + (words[:90] + ("..." if len(words) > 90 else ""))
        if a.next_how:
            label += f"  \u2192 next: {a.next_how}"
        x0 = min((t for t in (a.start, first, last, a.end) if t is not None), default=origin)
        x1 = max((t for t in (a.start, first, last, a.end) if t is not None), default=origin)
        right = (x0 - origin) > 0.5 * (data_end - origin)  # an attempt late in the run: its text ends at its end
        ax.text(((x1 if right else x0) - origin) / div, y + 0.3, label, va="bottom", ha="right" if right else "left",
                fontsize=8.5, color="#2ca02c" if ok else "#d62728", clip_on=False)
        prev = a
    _verdicts_on_time(ax, fig_data.verdicts, origin, div)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"attempt {a.number}\njob {a.job_id or '?'}" for a in reversed(data.attempts)], fontsize=9)
    ax.set_ylim(-0.6, n - 0.2)
    ax.set_xlabel(f"wall-clock time since the first attempt began ({unit})")
    ax.set_title("Attempts: where the wall-clock time went (text: why each ended, how the run went on)", fontsize=11)
    handles = [Patch(facecolor=c, label=label, hatch="//" if k == "gap" else None, edgecolor="#d62728" if k == "gap" else c)
               for k, (c, label) in GANTT.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=6, fontsize=8.5, frameon=False)
    ax.grid(alpha=0.3, axis="x")
    fig.savefig(path)
    plt.close(fig)


def _hbars(ax: Any, y: np.ndarray, width: np.ndarray, left: np.ndarray, colour: str, label: str, height: float) -> None:
    """Horizontal bars as one collection: barh makes a patch a bar, and 512 ranks' five phases (2,560 patches)
    took the report 2-3 s to lay out and draw on a 16k run."""
    from matplotlib.collections import PolyCollection  # noqa: PLC0415 - optional dependency, loaded by require()

    lo, hi, right = y - height / 2, y + height / 2, left + width
    verts = np.stack([np.column_stack(c) for c in ((left, lo), (left, hi), (right, hi), (right, lo))], axis=1)
    ax.add_collection(PolyCollection(verts, facecolors=colour, edgecolors="none", linewidths=0, label=label))


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
        _hbars(ax, y, width, left, PHASE_COLOURS[cat], label, 0.7)
        left += width
    ax.set_xlim(0, max(float(left.max()), 1e-9) * 1.02)
    ax.set_ylim(-0.6, n - 0.4)
    step = max(1, -(-n // 40))
    blamed = _blamed_ranks(fig_data.verdicts)
    ax.set_yticks(y[::step])
    ax.set_yticklabels([f"{int(r)} (blamed: {blamed[int(r)]})" if int(r) in blamed else str(int(r)) for r in ranks[::step]])
    for label in ax.get_yticklabels():
        if "blamed" in label.get_text():
            label.set_color(VERDICT_COLOUR)
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
    plot_loss(plt, data, out / "loss.png", fig_data.verdicts)
    plot_step_time(plt, fig_data, out / "step_time.png")
    plot_heatmap(plt, fig_data, out / "heatmap.png")
    plot_throughput(plt, data, out / "throughput.png", fig_data.verdicts)
    plot_attempts(plt, data, fig_data, out / "attempts.png", submitted)
    plot_phases(plt, fig_data, out / "phases.png")
    return list(FILES)
