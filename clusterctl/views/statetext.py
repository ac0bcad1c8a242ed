"""A run's state as plain text: the one line `submit --wait` prints whenever it changes, and its parts.

Plain strings (no terminal styling), so the command line, the qualification
ladder and the submitit plugin print the same words.
"""

from __future__ import annotations

from clusterctl.exitcodes import ExitCode
from clusterctl.views.state import CANCELLED, COMPLETED, FAILED, RESTARTING, STOPPING, TRAINING, RunState


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def progress(st: RunState) -> str:
    """Step, loss, throughput and ETA, as far as they are known."""
    parts = []
    if st.step is not None and st.state == COMPLETED and st.total_steps and st.step + 1 >= st.total_steps:
        parts.append(f"all {st.total_steps} steps done")  # steps count from 0: the last is total - 1
    elif st.step is not None:
        parts.append(f"step {st.step}" + (f"/{st.total_steps}" if st.total_steps else ""))
    if st.loss is not None:
        parts.append(f"loss {st.loss:.4f}")
    if st.tokens_per_s and st.state == TRAINING:
        parts.append(f"{st.tokens_per_s:,.0f} tokens/s")
    elif st.step_s and st.state == TRAINING:  # a script that reports no tokens: the pace the step watcher measures
        parts.append(f"{1 / st.step_s:.3g} steps/s" if st.step_s < 1 else f"{st.step_s:.3g} s a step")
    if st.eta_s is not None:
        parts.append(f"ETA {duration(st.eta_s)}")
    return ", ".join(parts)


def culprits(st: RunState) -> str:
    """The last attempt's culprits the reason does not name already; a script's error (88) names ranks, not culprits:
    no node is blamed for it."""
    last = st.attempts[-1] if st.attempts else None
    found = last.culprits if last else []
    named = [f"rank {c.get('rank')} on {c.get('host')}" if c.get("rank") is not None else str(c.get("host")) for c in found]
    named = [n for n in named if n not in (st.reason or "")]  # each sentence once: the reason may name them already
    if not named:
        return ""
    script = (last is not None and last.exit_code == ExitCode.SCRIPT_ERROR) or st.state == STOPPING
    return ("; raised on " if script else "; culprit ") + ", ".join(named)


def status_line(st: RunState) -> str:
    """One line: what `submit --wait` prints whenever it changes."""
    attempt = f"attempt {st.attempts[-1].attempt}" if st.attempts else ""
    head = st.state + (f" (exit {st.exit_code})" if st.state in (FAILED, CANCELLED) and st.exit_code not in (None, 0) else "")
    detail = ", ".join(p for p in ((attempt if st.state == TRAINING else ""), progress(st) if st.state == TRAINING else "") if p)
    reason = st.reason + (culprits(st) if st.state in (FAILED, RESTARTING, STOPPING) else "")
    return f"{head}: " + "; ".join(p for p in (detail, reason) if p) if (detail or reason) else head
