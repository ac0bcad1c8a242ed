"""Faults for the runtime tests, injected into one rank's Python at start-up.

Put this directory on PYTHONPATH and set CLUSTERCTL_TEST_FAULT=<kind>:<rank>.
Each fault imitates a broken node or process as the controller would meet it.
"""

import os
import sys
import time

_kind, _, _rank = os.environ.get("CLUSTERCTL_TEST_FAULT", "").partition(":")
if _kind and os.environ.get("RANK") == _rank and "clusterctl.launch" in getattr(sys, "orig_argv", []):
    if _kind == "never":  # hangs before it can register
        time.sleep(3600)
    elif _kind == "crash":  # dies before it can register
        sys.stderr.write("fault: this node's Python environment is broken\n")
        sys.exit(3)
    elif _kind == "dup":
        os.environ["RANK"] = str(int(_rank) - 1)
    elif _kind == "slow":
        import torch

        _matmul = torch.matmul

        def _slow_matmul(*args, **kwargs):  # a slower device: 20 ms more work per product
            until = time.thread_time() + 0.02
            while time.thread_time() < until:
                pass
            return _matmul(*args, **kwargs)

        torch.matmul = _slow_matmul
