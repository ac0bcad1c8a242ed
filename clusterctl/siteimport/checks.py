"""`site validate`'s end-to-end check: a rendered job binds every rank as the rail map says.

For each node type, a one-node job (tp = 1, one rank per GPU) is planned on
a partition of that type and rendered with the site's templates. Three
statements of the binding must agree with the node type's GPUs: the
binding table (`clusterctl.plan.binding.binding_table`, which run.json carries),
the bash arrays of the rendered wrapper (GPU_CPUS, GPU_NCPUS, GPU_NUMA,
GPU_NICS, GPU_HCA, GPU_UCX), and the environment each local rank gets
(`clusterctl.plan.binding.rank_env`, the Python statement of what the wrapper
computes). A site whose own templates bind differently fails here, with the
GPU, what the wrapper does and what the rail map says.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from clusterctl import envnames
from clusterctl.config.site import NodeType, Site
from clusterctl.errors import ClusterctlError, ConfigError, Problem
from clusterctl.plan.binding import IB_KINDS, binding_table, rank_env

RUN_DIR = Path("/clusterctl-site-check/run")
_ARRAY = re.compile(r"^(GPU_[A-Z]+)=\((.*)\)\s*$", re.M)


def expected_rows(nt: NodeType) -> dict[int, dict[str, str]]:
    """What the wrapper's arrays must hold for each physical GPU, straight from the rail map."""
    rows = {}
    for gpu in nt.gpus:
        nics = [(name, nt.nics[name]) for name in gpu.nics]
        hca = [f"{n}:{nic.port}" for n, nic in nics if nic.kind in IB_KINDS]
        rows[gpu.index] = {
            "GPU_CPUS": gpu.cpus or "",
            "GPU_NCPUS": str(len(gpu.cpu_set)),
            "GPU_NUMA": str(gpu.numa if gpu.numa is not None else 0),
            "GPU_NICS": ",".join(gpu.nics),
            "GPU_HCA": ("=" + ",".join(hca)) if hca else "",
            "GPU_UCX": ",".join(f"{n}:{nic.port}" if nic.kind in IB_KINDS else (nic.netdev or n) for n, nic in nics),
        }
    return rows


def wrapper_arrays(wrapper: str) -> dict[str, list[str]]:
    return {m.group(1): shlex.split(m.group(2)) for m in _ARRAY.finditer(wrapper)}


def binding_problems(site: Site, site_path: Path | None) -> tuple[list[Problem], list[str]]:
    """Problems (errors) and warnings from rendering a one-node job per node type."""
    from clusterctl.config.spec import JobSpec
    from clusterctl.plan import make_plan
    from clusterctl.render.scripts import render_run

    problems: list[Problem] = []
    warnings: list[str] = []
    for name, nt in site.node_types.items():
        base = f"node_types.{name}"
        partition = next((p for p, part in site.partitions.items() if part.node_type == name), None)
        if partition is None:
            warnings.append(f"{base}: no partition uses this node type; its binding was not rendered and checked")
            continue
        try:
            spec = JobSpec.model_validate(
                {
                    "name": "site-check",
                    "partition": partition,
                    "nodes": 1,
                    "time_limit": 2,
                    "signal": {"lead_s": 30},
                    "command": ["true"],
                }
            )
            plan = make_plan(spec, site, source=f"a one-node job on partition {partition}")
            rendered = render_run(plan, RUN_DIR, python="python3", standalone=True, site_path=site_path)
        except (ClusterctlError, ValueError) as exc:
            message = exc.message if isinstance(exc, ClusterctlError) else str(exc).splitlines()[0]
            problems.append(Problem(base, name, f"expected a node type a one-node job can be rendered for ({message})"))
            continue
        expected = expected_rows(nt)
        table = binding_table(nt)
        for row in table:
            want = expected[row.gpu]
            got = {
                "GPU_CPUS": row.cpus,
                "GPU_NCPUS": str(row.ncpus),
                "GPU_NUMA": str(row.numa),
                "GPU_NICS": row.nics,
                "GPU_HCA": row.nccl_ib_hca,
                "GPU_UCX": row.ucx_net_devices,
            }
            for key, value in got.items():
                if value != want[key]:
                    problems.append(_mismatch(base, row.gpu, "binding table", key, value, want[key]))
        if list(rendered.run_json.node_type.binding) != [row.as_dict() for row in table]:
            problems.append(Problem(f"{base}.gpus", name, "expected run.json to carry the binding table unchanged"))
        arrays = wrapper_arrays(rendered.files["wrapper.sh"])
        if not arrays:
            warnings.append(
                f"{base}: the wrapper template defines no GPU_CPUS/GPU_NICS arrays; its binding was not checked"
            )
        for key in ("GPU_CPUS", "GPU_NCPUS", "GPU_NUMA", "GPU_NICS", "GPU_HCA", "GPU_UCX"):
            if not arrays:
                break
            values = arrays.get(key)
            if values is None:
                problems.append(Problem(f"{base}.gpus", key, "expected the rendered wrapper to define this array"))
                continue
            if len(values) != len(nt.gpus):
                problems.append(
                    Problem(f"{base}.gpus", values, f"expected {key} in the rendered wrapper to have {len(nt.gpus)} entries")
                )
                continue
            for index, value in enumerate(values):
                if value != expected[index][key]:
                    problems.append(_mismatch(base, index, "rendered wrapper", key, value, expected[index][key]))
        layout = plan.dims.layout
        for rank in range(plan.gpus_per_node):
            env = rank_env(layout, plan.gpus_per_node, table, nt.gpu_vendor, rank)
            want = expected[int(env[envnames.GPU])]
            for key, var in (("GPU_CPUS", envnames.CPUS), ("GPU_NUMA", envnames.NUMA), ("GPU_NICS", envnames.NIC)):
                if env[var] != want[key]:
                    problems.append(_mismatch(base, rank, f"rank {rank}'s environment", var, env[var], want[key]))
    return problems, warnings


def _mismatch(base: str, gpu: int, where: str, key: str, got: str, want: str) -> Problem:
    return Problem(f"{base}.gpus[{gpu}]", got, f"the {where} gives GPU {gpu} {key}={got!r}; the rail map says {want!r}")


def check_bindings(site: Site, site_path: Path | None, source: str) -> list[str]:
    """Raise ConfigError listing every mismatch; return the warnings."""
    problems, warnings = binding_problems(site, site_path)
    if problems:
        raise ConfigError(source, problems)
    return warnings
