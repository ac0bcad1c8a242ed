#!/usr/bin/env bash
# The prepared GPU check: what only a real GPU can show, in a few minutes on one GPU.
#
#   bench/gpu_check.sh            # writes under $OUT (or a temporary directory); last line: one JSON object
#
# 1. `clusterctl site import --probe` on this machine (nvidia-smi and sysfs), written as a site whose one
#    node is this machine under the local backend (node1, rendezvous on lo);
# 2. a job on that site with the reference trainer on NCCL in bf16, asynchronous checkpoints (staged in
#    pinned memory), the default preflight (its gpu check reads NVML) and the aggregators' NVML sampling;
#    checked: the verdict, the torch/CUDA/NCCL versions the ranks registered, bf16 autocast in the run
#    record, a committed checkpoint, GPU samples in the timeline;
# 3. the plain DDP example (examples/own-script/train_ddp.py, imports nothing of clusterctl) on NCCL: its
#    steps reported with compute time timed on the GPU's stream (metrics.jsonl `compute_on: cuda`);
# 4. `clusterctl qualify --up-to node` on the same site (the worker and node rungs);
# 5. a warm restart: the reference trainer on NCCL with in-memory snapshots (`checkpoint.memory_interval: 1`,
#    pinned host buffers, copies on the GPU's stream), rank 0 killed after step 30: the restart's ranks forked
#    from the warm process server (no CUDA context in it), resumed from the snapshot of the last step.
# Without an NVIDIA GPU it says so and exits 0. Every step's output is kept under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-.venv/bin/python}
[[ -x $PY ]] || PY=python3
OUT=${OUT:-$(mktemp -d /tmp/clusterctl-gpu-check.XXXXXX)}
mkdir -p "$OUT"
CLUSTERCTL=("$PY" -c 'from clusterctl.cli import main; main()')

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$OUT/nvidia-smi.txt" 2>&1; then
    echo '{"gpu": false, "skipped": "no NVIDIA GPU here (nvidia-smi -L failed or is missing)"}'
    exit 0
fi
GPUS=$(grep -c '^GPU ' "$OUT/nvidia-smi.txt")
export CLUSTERCTL_LOCAL_STATE="$OUT/local-state" CLUSTERCTL_LOCAL_NODES=node1

step() {  # step NAME TIMEOUT CMD...: run one step, its output in $OUT/NAME.log, its exit code in $OUT/NAME.rc
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*" >&2
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo $? >"$OUT/$name.rc"
    tail -n 5 "$OUT/$name.log" >&2
}

step probe 120 "${CLUSTERCTL[@]}" site import --probe --name gpu-check --nodes node1 --partition local --interface lo --nic lo
sed -n '/^name:/,$p' "$OUT/probe.log" >"$OUT/site.yaml"
"$PY" - "$OUT/site.yaml" <<'EOF'
import sys, yaml
path = sys.argv[1]
site = yaml.safe_load(open(path))
site.setdefault("network", {})["addresses"] = {"node1": "127.0.0.1"}
site["network"].pop("interface", None)
open(path, "w").write(yaml.safe_dump(site, sort_keys=False))
EOF

cat >"$OUT/job.yaml" <<EOF
name: gpu-check
site: $OUT/site.yaml
time_limit: 20m
nodes: 1
gpus_per_node: $GPUS
precision: bf16
recompute: none
seq_len: 256
batch: {micro: 8, grad_accum: 1}
model: {layers: 4, hidden: 512, heads: 8, vocab: 4096, ffn: 2048}
signal: {lead_s: 60}
checkpoint: {interval: 50, async: true}
runs_root: $OUT/runs
command: [python3, -m, clusterctl.trainer, --steps, "200", --eval-interval, "50"]
qualify: {steps: 40, long_s: 20}
EOF
step train 300 "${CLUSTERCTL[@]}" submit "$OUT/job.yaml" --backend local --wait
cat >"$OUT/own.yaml" <<EOF
name: gpu-own
site: $OUT/site.yaml
time_limit: 10m
nodes: 1
gpus_per_node: $GPUS
runs_root: $OUT/runs
command: [python3, $PWD/examples/own-script/train_ddp.py]
env: {STEPS: "300", BUSY_S: "0.02"}
EOF
step own 150 "${CLUSTERCTL[@]}" submit "$OUT/own.yaml" --backend local --wait
step qualify 300 "${CLUSTERCTL[@]}" qualify "$OUT/job.yaml" -o "$OUT/qualify" --up-to node --backend local
cat >"$OUT/warm.yaml" <<EOF
name: gpu-warm
site: $OUT/site.yaml
time_limit: 10m
nodes: 1
gpus_per_node: $GPUS
precision: bf16
seq_len: 256
batch: {micro: 8, grad_accum: 1}
model: {layers: 4, hidden: 512, heads: 8, vocab: 4096, ffn: 2048}
checkpoint: {interval: 1000, memory_interval: 1}
runs_root: $OUT/runs
command: [python3, -m, clusterctl.trainer, --steps, "120", --eval-interval, "0"]
EOF
( timeout 300 "${CLUSTERCTL[@]}" submit "$OUT/warm.yaml" --backend local --wait >"$OUT/warm.log" 2>&1; echo $? >"$OUT/warm.rc" ) &
WARM_SUBMIT=$!
for ((i = 0; i < 400; i++)); do  # until the first attempt has done 30 steps
    metrics=$(find "$OUT/runs" -path '*gpu-warm-*/attempt-1/metrics.jsonl' 2>/dev/null | head -n 1)
    [[ -n "$metrics" ]] && (($(wc -l <"$metrics") >= 30)) && break
    sleep 0.5
done
step warmkill 120 "${CLUSTERCTL[@]}" drill "$(find "$OUT/runs" -maxdepth 1 -name 'gpu-warm-*' | head -n 1)" --kill 0
wait "$WARM_SUBMIT"

"$PY" - "$OUT" "$GPUS" <<'EOF'
import glob, json, os, sys
out, gpus = sys.argv[1], int(sys.argv[2])
rc = lambda name: int(open(f"{out}/{name}.rc").read().strip() or 1)
found = {"gpu": True, "gpus": gpus, "probe_rc": rc("probe"), "train_rc": rc("train"), "own_rc": rc("own"),
         "qualify_rc": rc("qualify"), "out": out}
own = sorted(glob.glob(f"{out}/runs/gpu-own-*/attempt-1/metrics.jsonl"))
if own:
    lines = [json.loads(line) for line in open(own[-1])]
    on_device = [r for r in lines if r.get("compute_on") == "cuda"]
    found["own_script"] = {"steps": len(lines), "compute_on_cuda": len(on_device),
                           "compute_s_p50": sorted(r["compute_s"] for r in on_device)[len(on_device) // 2] if on_device else None,
                           "step_s_p50": sorted(r["step_s"] for r in lines)[len(lines) // 2] if lines else None}
runs = sorted(glob.glob(f"{out}/runs/gpu-check-*"))
if runs:
    run = runs[-1]
    try:
        ranks = json.load(open(f"{run}/attempt-1/manifest.json")).get("ranks") or []
    except (OSError, ValueError):
        ranks = []
    found["versions"] = ranks[0].get("versions") if ranks else None
    timeline = f"{run}/attempt-1/timeline.jsonl"
    found["nvml_samples"] = sum('"kind": "gpu"' in line for line in open(timeline)) if os.path.exists(timeline) else 0
    found["checkpoints"] = sorted(os.path.basename(p) for p in glob.glob(f"{run}/checkpoints/step-*"))
    metrics = f"{run}/attempt-1/metrics.jsonl"
    if os.path.exists(metrics):
        lines = [json.loads(line) for line in open(metrics)]
        steady = sorted(r["step_s"] for r in lines[10:]) or [None]
        found.update(steps=len(lines), step_s_p50=steady[len(steady) // 2], tokens_per_s=lines[-1].get("tokens_per_s"),
                     loss_first=lines[0]["loss"], loss_last=lines[-1]["loss"])
    record = glob.glob(f"{run}/attempt-1/record.json")
    if record:
        found["precision"] = json.load(open(record[0])).get("training", {}).get("precision")
warm = sorted(glob.glob(f"{out}/runs/gpu-warm-*"))
if warm:
    from clusterctl.rundir import rankmanifest

    second = f"{warm[-1]}/attempt-2"
    record = json.load(open(f"{second}/record.json")) if os.path.exists(f"{second}/record.json") else {}
    first = f"{warm[-1]}/attempt-1/verdict.json"
    verdict = json.load(open(first)) if os.path.exists(first) else {}
    steps = [json.loads(line) for line in open(f"{second}/metrics.jsonl")] if os.path.exists(f"{second}/metrics.jsonl") else []
    found["warm_restart"] = {
        "rc": rc("warm"), "drill_rc": rc("warmkill"), "verdict": verdict.get("message"),
        "resumed": (record.get("recovery") or {}).get("how"),
        "starts": [r.get("start") for r in rankmanifest.iter_ranks(f"{second}/manifest.json")] if os.path.exists(second) else None,
        "first_step": steps[0].get("step") if steps else None,
    }
try:
    report = json.load(open(f"{out}/qualify/report.json"))
    found["qualify"] = {r["name"]: {"passed": r["passed"], "reason": r["reason"]} for r in report["rungs"]}
except (OSError, ValueError):
    found["qualify"] = None
print(json.dumps(found, default=str))
EOF
