"""`python -m clusterctl.runtime.controller`: the controller's entry point (main.py)."""

import sys

from clusterctl.runtime.controller.main import main

sys.exit(main())
