#!/usr/bin/env bash
# The CUDA-path check for a machine with one NVIDIA GPU (e.g. a lent H200), as one short
# script: environment, NCCL collectives, bf16 and fp16 training with CUDA memory stats and
# MFU against the catalog peak, FSDP2 16-bit parameters, and 2:4 sparse kernels.
# Not run in CI (CI has no GPU). Results go to $OUT (or benchmarks/results/gpu/).
#   usage: bash benchmarks/gpu_check.sh        (after `bash scripts/setup.sh`)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results/gpu}
mkdir -p "$out"
F=.venv/bin/flopwise
[ -x "$F" ] || F="python3 -m flopwise"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor

step() { echo; echo "== $1"; }
common=(configs/gpu_single_node.yaml parallel.nproc_per_node=1 training.max_steps=60
        training.global_batch_size=16 training.eval_every=30 training.eval_batches=4
        checkpoint.every_steps=null data.max_bytes=20000000 logging.progress=false)

step doctor;            $F doctor --json > "$out/doctor.json"; $F doctor | tail -25
step "nccl bench";      $F bench --op all_reduce,all_gather --sizes 1M,16M,256M --out "$out/bench.json" | tail -12
step "bf16 autocast";   $F train "${common[@]}" precision.mode=bf16 logging.run_dir=/tmp/gpu_bf16 | tail -14
cp /tmp/gpu_bf16/predicted_vs_measured.json "$out/bf16_predicted_vs_measured.json"
step "fp16 + GradScaler"; $F train "${common[@]}" precision.mode=fp16 training.compile=false logging.run_dir=/tmp/gpu_fp16 | tail -14
tail -n 1 /tmp/gpu_fp16/metrics.rank0.jsonl > "$out/fp16_last_step.json"
step "FSDP2 bf16 params + fp32 reduce + checkpointing"
$F train "${common[@]}" precision.mode=bf16-params training.gradient_checkpointing=true training.compile=false \
   logging.run_dir=/tmp/gpu_bf16p | tail -14
cp /tmp/gpu_bf16p/predicted_vs_measured.json "$out/bf16_params_predicted_vs_measured.json"
step "2:4 sparse kernels"
$F compress --task digits-mlp --method 2:4 --out /tmp/gpu_24 --json > "$out/sparse24.json"; tail -c 600 "$out/sparse24.json"
echo; echo "results in $out"
