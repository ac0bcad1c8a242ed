"""Importers that write a site config from what a node reports about itself.

- `nvsmi`: the text of `nvidia-smi topo -m` (GPU x GPU and GPU x NIC matrix,
  CPU and NUMA affinity, the NIC legend);
- `slurmconf`: Slurm's `topology.conf` (switch tree or blocks) and
  `gres.conf` (GPU devices, their cores and NVLinks, node names);
- `probe`: the same facts read live on a compute node (nvidia-smi and sysfs);
- `cpus`: how GPUs that share a socket's CPUs get disjoint CPU sets;
- `build`: choosing each GPU's NIC, numbering the rails, and assembling the
  site config (a dict that `clusterctl.config.site` validates, and its YAML);
- `checks`: `site validate`'s check that a rendered job binds every rank as
  the rail map says.

Every parser raises `ConfigError` naming the input, the line and what was
expected; nothing here prints.
"""
