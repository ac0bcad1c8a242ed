"""`python -m clusterctl.launch -- <command>`: the rank's entry point (clusterctl/runtime/launch.py).

Every rendered wrapper execs this name, run directories rendered before the
code moved included; it stays a thin alias.
"""

import sys

from clusterctl.runtime.launch import main

if __name__ == "__main__":
    sys.exit(main())
