"""The trainer's busy compute: calibrated work takes about the time asked, and a stopped process takes longer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from clusterctl.trainer.busy import calibrate, spin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = (
    "import sys, time\n"
    "from clusterctl.trainer.busy import spin\n"
    "t = time.perf_counter()\n"
    "spin(int(sys.argv[1]))\n"
    "print(time.perf_counter() - t)\n"
)


def start_child(units: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(units)], cwd=ROOT, stdout=subprocess.PIPE, text=True)


def seconds_of(child: subprocess.Popen) -> float:
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    return float(out)


def stop_half_of_the_time(pid: int, done: threading.Event) -> None:
    """SIGSTOP for 50 ms, SIGCONT for 50 ms, until `done` or the process is gone; leaves it running."""
    try:
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.05)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
    except ProcessLookupError:
        pass
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_calibrated_units_take_about_the_seconds_asked() -> None:
    rate = calibrate(0.3)
    assert rate > 0
    t = time.perf_counter()
    spin(round(0.4 * rate))
    took = time.perf_counter() - t
    assert 0.2 < took < 0.8, f"{took:.3f} s for 0.4 s of calibrated work (rate {rate:.0f} units/s)"
    t = time.perf_counter()
    spin(0)
    assert time.perf_counter() - t < 0.01


def test_a_process_stopped_half_of_the_time_takes_about_twice_as_long() -> None:
    units = round(0.4 * calibrate(0.3))
    # Both at once, so that both see the same load from whatever else runs on the machine.
    free, stopped = start_child(units), start_child(units)
    done = threading.Event()
    cycler = threading.Thread(target=stop_half_of_the_time, args=(stopped.pid, done), daemon=True)
    cycler.start()
    try:
        free_s = seconds_of(free)
        stopped_s = seconds_of(stopped)
    finally:
        done.set()
        cycler.join()
        for child in (free, stopped):
            if child.poll() is None:
                child.kill()
                child.wait()
    # About 2x on a quiet machine; a sleep would give 1x. Other load on two cores narrows it (1.38x seen in CI).
    assert stopped_s > 1.25 * free_s, f"free {free_s:.3f} s, stopped half of the time {stopped_s:.3f} s"
