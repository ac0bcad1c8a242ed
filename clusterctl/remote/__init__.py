"""Remote use: every command run from a laptop against a cluster's login node over SSH.

The laptop renders and checks; the login node's own clusterctl does what
needs the cluster (sbatch, squeue, reading run directories), so both sides
agree on the run directory's format by construction once their versions
are checked. `target` says where to go, `sshconfig` reads ~/.ssh/config,
`transport` carries commands and files (paramiko, or the ssh executable),
`client` speaks to the remote clusterctl, `stage` builds and ships a run.
"""
