"""submitit's `clusterctl` executor and job environment (the `submitit` extra).

Registered through submitit's entry points (group `submitit`, names
`executor` and `job_environment`), so `submitit.AutoExecutor(folder,
cluster="clusterctl")` finds it. submitit imports this package whenever it
looks for executors, also in programs that never use it: everything heavy
(the spec model, the planner, the backends) is imported on first use.
"""

from clusterctl.integrations.submitit.environment import ClusterctlJobEnvironment
from clusterctl.integrations.submitit.executor import ClusterctlExecutor, ClusterctlJob

__all__ = ["ClusterctlExecutor", "ClusterctlJob", "ClusterctlJobEnvironment"]
