"""index.html: one self-contained page (inline CSS, no script, images by relative path) that works from disk."""

from __future__ import annotations

import html
import json
import time
from typing import Any

from clusterctl.syntax.units import format_figure
from clusterctl.views.report.plots import FILES

CAPTIONS = {
    "loss.png": "Training and validation loss against step and wall-clock time; dashed lines mark where each attempt began.",
    "step_time.png": "Step time per rank: steady interval (p50 to p90 bar, line to the max, outliers kept) and the warm-up steps apart.",
    "heatmap.png": "Each rank's compute time relative to the step's median over ranks, on a fixed scale: a healthy run is"
                   " uniformly dark, a straggler a bright row, a step no rank finished a grey gap; verdicts are marked.",
    "throughput.png": "Tokens per second over wall-clock time: a rolling median with its min-max band; a hang or a gap"
                      " drops to zero.",
    "attempts.png": "The attempts on a wall-clock timeline: queue wait, restart gaps, start-up, training, saves, and how each ended.",
    "phases.png": "Where each rank's time went: compute, collective, save, eval and idle phases (seconds, all attempts).",
}

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1180px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.bad { color: #b00; } .ok { color: #060; } .note { color: #666; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 1em; font-size: 0.9em; }
dt { font-weight: bold; } dd { margin: 0; word-break: break-word; }
details { margin: 0.3em 0; } summary { cursor: pointer; font-weight: bold; }
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


_fmt = format_figure  # the terminal's figures: 18,357 tokens/s, not 1.836e+04


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + " UTC"


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{_e(_fmt(c))}</td>' for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _dl(data: Any, depth: int = 0) -> str:
    if isinstance(data, dict) and data and depth < 4:
        items = "".join(f"<dt>{_e(k)}</dt><dd>{_dl(v, depth + 1)}</dd>" for k, v in data.items())
        return f"<dl>{items}</dl>"
    if isinstance(data, (dict, list)):
        text = json.dumps(data, sort_keys=True, default=str)
        return _e(text if len(text) <= 600 else text[:600] + " ...")
    return _e(_fmt(data))


def _status(v: dict[str, Any]) -> str:
    """ok, failed or cancelled (stats.verdict_summary); a headline from before `status` existed has only `ok`."""
    return str(v.get("status") or ("ok" if v.get("ok") else "failed"))


def _culprits(v: dict[str, Any]) -> str:
    parts = []
    for c in v.get("culprits") or []:
        where = f"rank {c.get('rank', '?')} on {c.get('host', '?')}"
        if c.get("gpu") is not None:
            where += f" (GPU {c['gpu']})"
        parts.append(where + (f": {c['reason']}" if c.get("reason") else ""))
    return "; ".join(parts) or "-"


def render(head: dict[str, Any], state: dict[str, Any] | None, attempts: list[dict[str, Any]],
           record: dict[str, Any] | None, record_source: str) -> str:
    """The page's HTML text."""
    out = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>Report: {_e(head['run'])}</title>",
           f"<style>{CSS}</style></head><body>", f"<h1>Run report: {_e(head['run'])}</h1>",
           f"<p class=note>Written {_e(_when(time.time()))} by clusterctl report.</p>"]

    out.append("<h2>Headline</h2>")
    rows: list[list[Any]] = []
    if state is not None:
        rows += [["state", state.get("state")], ["why", state.get("reason") or "-"], ["job", state.get("job_id")],
                 ["latest committed checkpoint (step)", state.get("checkpoint")],
                 ["goodput (kept GPU time / allocated)", f"{state['goodput']:.1%}" if isinstance(state.get("goodput"), float) else None],
                 ["allocated GPU hours", state.get("allocated_gpu_hours")], ["useful GPU hours", state.get("useful_gpu_hours")],
                 ["start-up GPU hours", state.get("startup_gpu_hours")], ["lost GPU hours", state.get("lost_gpu_hours")],
                 ["other GPU hours", state.get("other_gpu_hours")]]
    rows += [["attempts", head.get("attempts")], ["last step", head.get("last_step")], ["final loss", head.get("final_loss")],
             ["final validation loss", head.get("final_val_loss")], ["best validation loss", head.get("best_val_loss")],
             ["median tokens/s", head.get("tokens_per_s_median")]]
    slow = head.get("slowest_rank")
    if slow:
        rows.append([f"slowest rank ({slow['by']})",
                     f"rank {slow['rank']}: {slow['seconds']} s, {slow['vs_median']}x the median rank's"])
    out.append(_table(["", ""], rows))
    if state is None and head.get("state_note"):
        out.append(f"<p class=note>{_e(head['state_note'])}</p>")

    out.append("<h2>Verdicts</h2>")
    if head.get("verdicts"):
        vrows = "".join(
            f"<tr><td>{v['attempt']}</td><td class={'bad' if _status(v) == 'failed' else 'ok'}>{_e(_status(v))}</td>"
            f"<td>{_e(_fmt(v.get('code')))}</td><td>{_e(v.get('message'))}</td><td>{_e(_culprits(v))}</td></tr>"
            for v in head["verdicts"]
        )
        out.append(f"<table><tr><th>attempt</th><th>status</th><th>code</th><th>message</th><th>culprits</th></tr>{vrows}</table>")
    else:
        out.append("<p class=note>No verdict.json in any attempt.</p>")

    out.append("<h2>Attempts</h2>")
    if attempts:
        cols = list(attempts[0].keys())
        out.append(_table(cols, [[_when(r[c]) if c in ("start", "end") else r[c] for c in cols] for r in attempts]))
    else:
        out.append("<p class=note>No attempt has started.</p>")

    out.append(f"<h2>Step time per rank (steady; the first {_e(head.get('warmup_steps_per_attempt'))} steps of each attempt are warm-up)</h2>")
    per = head.get("step_time_s") or {}
    if per:
        out.append(_table(["rank", "p50 (s)", "p90 (s)", "max (s)", "steady steps", "warm-up steps"],
                          [[r, f["p50"], f["p90"], f["max"], f["steady_steps"], f["warmup_steps"]] for r, f in per.items()],
                          numeric={1, 2, 3, 4, 5}))
    else:
        out.append("<p class=note>No step records in timeline.jsonl.</p>")

    out.append("<h2>Plots</h2>")
    for name in FILES:
        out.append(f'<figure><img src="{name}" alt="{_e(CAPTIONS[name])}"><figcaption>{_e(CAPTIONS[name])}</figcaption></figure>')

    if record is not None:  # one collapsed section each: the environment alone is pages long
        sections = "".join(f"<details><summary>{_e(key)}</summary>{_dl(value)}</details>" for key, value in record.items())
        out.append(f"<h2>Run record</h2><p class=note>From {_e(record_source)}; open a section to read it.</p>{sections}")

    if head.get("notes"):
        out.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in head["notes"]) + "</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)
