"""A plain script with its own SIGTERM handler and a save of 1.2 s: what a preemption or scancel must let finish.

No torch and no clusterctl import: a user's loop that notes the signal,
finishes its step, saves, and exits 0. It writes step-RANK every step and
saved-RANK (the step it saved) into the folder its one argument names.
"""

import os
import signal
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
rank = os.environ["RANK"]
stop = False


def asked(*_: object) -> None:
    global stop
    stop = True


signal.signal(signal.SIGTERM, asked)
step = 0
while not stop:
    step += 1
    (out / f"step-{rank}").write_text(str(step))
    time.sleep(0.1)
time.sleep(1.2)  # the save: over a second, and room inside KillWait (2 s) for the ranks to exit and the verdict to land
(out / f"saved-{rank}").write_text(str(step))
