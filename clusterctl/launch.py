"""`python -m clusterctl.launch -- <command>`: the rank's entry point (clusterctl/runtime/rank/launch.py).

Every rendered wrapper execs this name, run directories rendered before the
code moved included; it stays a thin alias. Where the job runs warm process
servers, this process first asks its node's server to fork the rank
(runtime/node/warm/client.py) and stands in for it; otherwise, or when that
cannot be done, the rank starts here, cold, with the reason recorded.
"""

import sys

if __name__ == "__main__":
    from clusterctl.runtime.node.warm.client import run_warm

    run_warm([sys.executable, "-m", "clusterctl.launch", *sys.argv[1:]])
    from clusterctl.runtime.rank.launch import main

    sys.exit(main())
