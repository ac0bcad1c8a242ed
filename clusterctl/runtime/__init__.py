"""Node side: the code that runs on compute nodes, one room per process.

rank/: the training process (launch, rendezvous, heartbeats, step watching,
preflight and post checks); controller/: one per attempt on the first node
(the rendezvous store, admission, the watchdog, blame, the verdict);
node/: one per node (the aggregator, the warm process server); recovery/:
the batch host's step after each attempt; wire/: what those processes say
to each other, one definition for both sides. A room imports the wire and
the layers below the runtime; the few other crossings are listed, with
their reasons, in tests/test_layers.py.

aggregator.py, nextattempt.py and warm/ here are thin aliases for run
directories rendered before the rooms (their batch scripts name those
modules); nothing new imports them.
"""


def alias(old: str, new: str) -> None:
    """Make module `old` the module `new`: imported, it is `new`; run with `python -m`, it runs `new`. (Imports
    inside: every node-side module imports this package, only an alias needs them.)"""
    import importlib
    import runpy
    import sys

    if old == "__main__":
        runpy.run_module(new, run_name="__main__", alter_sys=True)
    else:
        sys.modules[old] = importlib.import_module(new)
