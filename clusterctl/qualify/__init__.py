"""`clusterctl qualify`: the distributed-training validation ladder, one rung after another, as real jobs.

The rungs, in order: worker, node, comm, nvlink (multi-node NVLink, where
the site has it), boundary, scaling, data, restart,
failure, long, report. Each states its pass criterion before it runs, runs
the reference trainer (or a drill) as jobs on the site, measures, and is
judged; the ladder stops at the first rung that fails, and the report
(report.json, index.html) is written however far it got. On sites whose
emulated GPUs share CPUs (`oversubscribe: true`) performance is measured and
reported but not judged.

definition.py: the versioned test definition (trainer arguments, model,
batch) and the spec overrides each rung's jobs use; jobs.py: run one job and
wait for its end, optionally acting on it meanwhile (a drill); rungs.py: the
rungs; ladder.py: order, stop, report.json; page.py: index.html.
"""

RUNGS = ("worker", "node", "comm", "nvlink", "boundary", "scaling", "data", "restart", "failure", "long", "report")
