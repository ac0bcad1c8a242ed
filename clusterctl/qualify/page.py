"""index.html of a qualification: the headline (quality first), every rung, scaling with a plot; offline."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

PLOT = "scaling.png"


def _plot(out: Path, points: list[dict[str, Any]]) -> str | None:
    if len(points) < 1:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    nodes = [p["nodes"] for p in points]
    fig, left = plt.subplots(figsize=(6.5, 3.6), dpi=110)
    left.plot(nodes, [p["throughput"] or 0 for p in points], "o-", color="tab:blue", label="tokens/s")
    left.set_xlabel("nodes")
    left.set_ylabel("tokens/s", color="tab:blue")
    left.set_xticks(nodes)
    right = left.twinx()
    right.plot(nodes, [p["efficiency"] or 0 for p in points], "s--", color="tab:orange", label="efficiency")
    right.set_ylim(0, max(1.1, max((p["efficiency"] or 0) for p in points) * 1.1))
    right.set_ylabel("scaling efficiency (speedup / nodes)", color="tab:orange")
    left.set_title("Scaling: the same definition at each node count")
    fig.tight_layout()
    fig.savefig(out / PLOT)
    plt.close(fig)
    return PLOT


def _cell(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"<pre>{html.escape(json.dumps(value, indent=1, default=str))}</pre>"
    return html.escape("-" if value is None else str(value))


def write_page(out: Path, report: dict[str, Any]) -> Path:
    q = report.get("quality") or {}
    status = "PASSED" if report.get("passed") else f"STOPPED at {report.get('stopped_at') or 'an unfinished rung'}"
    if report.get("started_at"):
        status += f" (started at {report['started_at']}: the rungs below it were not run)"
    rows = "".join(
        f"<tr class={'ok' if r['passed'] else 'bad'}><td>{html.escape(r['name'])}</td><td>{'passed' if r['passed'] else 'FAILED'}"
        f"{'' if r.get('judged', True) else ' (performance not judged)'}</td><td>{html.escape(r['criterion'])}</td>"
        f"<td>{html.escape(r.get('reason') or '')}</td><td>{_cell(r.get('measured'))}</td></tr>"
        for r in report.get("rungs", [])
    )
    scale = "".join(
        f"<tr><td>{p['nodes']}</td><td>{_cell(p.get('throughput'))}</td><td>{_cell(p.get('efficiency'))}</td>"
        f"<td>{_cell(p.get('step_time_p50'))}</td><td>{_cell(p.get('step_time_p90'))}</td><td>{_cell(p.get('communication_fraction'))}</td></tr>"
        for p in report.get("scaling", [])
    )
    plot = _plot(out, report.get("scaling", []))
    text = f"""<!doctype html><html><head><meta charset="utf-8"><title>clusterctl qualify: {html.escape(status)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}} tr.bad td{{background:#fde8e8}}
tr.ok td:nth-child(2){{color:#1a7f37}} pre{{margin:0;font-size:11px;max-height:18em;overflow:auto}}</style></head><body>
<h1>Cluster qualification: {html.escape(status)}</h1>
<h2>Quality (the headline)</h2>
<table><tr><th>target validation loss</th><th>reached</th><th>time to target</th><th>best validation loss</th></tr>
<tr><td>{_cell(q.get('target'))}</td><td>{_cell(q.get('reached'))}</td><td>{_cell(q.get('time_to_target_s'))} s</td>
<td>{_cell(q.get('best_val_loss'))}</td></tr></table>
<h2>Rungs</h2><table><tr><th>rung</th><th>result</th><th>criterion</th><th>why</th><th>measured</th></tr>{rows}</table>
<h2>Scaling</h2>{f'<img src="{plot}" alt="scaling">' if plot else ''}
<table><tr><th>nodes</th><th>tokens/s</th><th>efficiency</th><th>step p50 s</th><th>step p90 s</th><th>communication fraction</th></tr>{scale}</table>
<h2>Test definition, site, software</h2>
<table><tr><th>definition</th><td>{_cell(report.get('definition'))}</td></tr>
<tr><th>site</th><td>{_cell(report.get('site'))}</td></tr><tr><th>topology</th><td>{_cell(report.get('topology'))}</td></tr>
<tr><th>parallel</th><td>{_cell(report.get('parallel'))}</td></tr><tr><th>software and hardware</th><td>{_cell(report.get('software'))}</td></tr>
<tr><th>failures</th><td>{_cell(report.get('failures'))}</td></tr></table>
<p>Runs of every rung: {html.escape(str(report.get('runs_root')))} (clusterctl report RUN for any of them).</p>
</body></html>
"""
    path = out / "index.html"
    path.write_text(text, encoding="utf-8")
    return path
