#!/usr/bin/env bash
# Run every command of the README tour, in order, in a fresh clone of this checkout, and time each.
#
#   scripts/tour.sh [WORKDIR]          # clone into WORKDIR (default: a new temporary folder)
#
# Training commands get training.max_steps=$TOUR_STEPS (default 20) so the whole tour takes
# minutes, not hours; everything else runs exactly as the README shows it. "path/to/config.json"
# and "my_corpus/" of the README are a small HuggingFace Llama config and a text folder written
# here. Environment:
#   TOUR_PYTHON   run `$TOUR_PYTHON -m flopwise` with the clone's src/ first on the path instead
#                 of `make setup` + .venv/bin/flopwise (the slow tests use this)
#   TOUR_STEPS    training steps per training command (default 20)
#   TOUR_RESULTS  write the per-step times as JSON to this file
# Exits non-zero at the first command that fails or does not leave what the README promises.
set -euo pipefail
SOURCE=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-$(mktemp -d -t flopwise-tour-XXXXXX)}
STEPS=${TOUR_STEPS:-20}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

seconds_since() {  # seconds since a `date +%s%N` reading, one decimal
  local ms=$(( ($(date +%s%N) - $1) / 1000000 ))
  printf '%d.%d' $((ms / 1000)) $(((ms % 1000) / 100))
}

git clone -q "$SOURCE" "$WORK/flopwise"
cd "$WORK/flopwise"
if [ -n "${TOUR_PYTHON:-}" ]; then
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  FLOPWISE=("$TOUR_PYTHON" -m flopwise)
else
  START=$(date +%s%N)
  make setup
  SETUP_SECONDS=$(seconds_since "$START")
  FLOPWISE=(.venv/bin/flopwise)
fi

mkdir -p path/to my_corpus
cat > path/to/config.json <<'JSON'
{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 4096, "hidden_size": 128,
 "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
python3 - <<'PY'
import pathlib, sysconfig
lib = pathlib.Path(sysconfig.get_paths()["stdlib"])
text = "".join(p.read_text(errors="replace") for p in sorted(lib.glob("[a-e]*.py"))[:40])
pathlib.Path("my_corpus/stdlib_sample.txt").write_text(text)
PY

TIMES=()
step() {  # step "README command" args...: run it, time it, stop on failure
  local shown=$1
  shift
  local start seconds
  start=$(date +%s%N)
  echo "=== $shown"
  if ! "$@"; then
    echo "tour: FAILED: $shown" >&2
    exit 1
  fi
  seconds=$(seconds_since "$start")
  echo "=== $seconds s"
  TIMES+=("{\"command\": \"${shown//\"/\\\"}\", \"seconds\": $seconds}")
}
expect_file() {  # the README promises this file
  [ -s "$1" ] || { echo "tour: $1 was not written" >&2; exit 1; }
}
fw() { "${FLOPWISE[@]}" "$@"; }
TRAIN="training.max_steps=$STEPS"

# Plan before you spend
step "flopwise plan" fw plan
step "flopwise plan --model llama2-70b --hardware a100-80gb --gpus 64 --tp 8 --tokens 2T" \
  fw plan --model llama2-70b --hardware a100-80gb --gpus 64 --tp 8 --tokens 2T
step "flopwise plan --model path/to/config.json --hardware h100-sxm --gpus 16 --json" \
  fw plan --model path/to/config.json --hardware h100-sxm --gpus 16 --json
step "flopwise plan --model llama3-70b --gpus 64 --stack nemo --precision fp8 --tp 4 --pp 4 --virtual-stages 5 --cp 2 --seq-len 8192" \
  fw plan --model llama3-70b --gpus 64 --stack nemo --precision fp8 --tp 4 --pp 4 --virtual-stages 5 --cp 2 --seq-len 8192
step "flopwise plan --model mixtral-8x7b --gpus 64 --stack megatron-core --pp 4 --ep 8 --seq-len 4096" \
  fw plan --model mixtral-8x7b --gpus 64 --stack megatron-core --pp 4 --ep 8 --seq-len 4096
step "flopwise plan --model \"Nemotron-H 56B\" --hardware H100 --num-gpus 64 --tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 192 --seq-length 8192 --precision FP8-CS --stack NeMo" \
  fw plan --model "Nemotron-H 56B" --hardware H100 --num-gpus 64 --tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 192 --seq-length 8192 --precision FP8-CS --stack NeMo
step "flopwise plan --model \"DeepSeek-V3\" --hardware H100 --num-gpus 1024 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 16 --expert-model-parallel-size 64 --micro-batch-size 1 --global-batch-size 8192 --seq-length 4096 --recompute-granularity selective --recompute-modules mla_up_proj mlp moe --stack NeMo" \
  fw plan --model "DeepSeek-V3" --hardware H100 --num-gpus 1024 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 16 --expert-model-parallel-size 64 --micro-batch-size 1 --global-batch-size 8192 --seq-length 4096 --recompute-granularity selective --recompute-modules mla_up_proj mlp moe --stack NeMo
step "flopwise plan --model gpt3-175b --hardware a100-80gb --gpus 1024 --global-batch 1536 --tokens 300B --search --top 5" \
  fw plan --model gpt3-175b --hardware a100-80gb --gpus 1024 --global-batch 1536 --tokens 300B --search --top 5
step "flopwise compare --model llama2-7b --tokens 1T --gpus 64" fw compare --model llama2-7b --tokens 1T --gpus 64
step "flopwise plan --model llama2-7b --hardware a100-40gb --gpus 128 --tokens 1T --spot ..." \
  fw plan --model llama2-7b --hardware a100-40gb --gpus 128 --tokens 1T --spot \
    --preemptions-per-day 2 --checkpoint-seconds 120 --restart-seconds 600
step "flopwise compare --model llama2-7b --tokens 10B --hardware rtx4090 --gpus 4 --local" \
  fw compare --model llama2-7b --tokens 10B --hardware rtx4090 --gpus 4 --local
[ -z "$(ls -d compare-* hybrid-* 2>/dev/null)" ] || { echo "tour: compare wrote files without --out" >&2; exit 1; }
step "flopwise plan --model llama2-7b --hardware rtx4090 --gpus 1 --finetune qlora" \
  fw plan --model llama2-7b --hardware rtx4090 --gpus 1 --finetune qlora
step "flopwise compare --model llama2-70b --hardware rtx4090 --gpus 4 --local --finetune qlora --tokens 1B" \
  fw compare --model llama2-70b --hardware rtx4090 --gpus 4 --local --finetune qlora --tokens 1B
step "flopwise plan --model llama3-8b --hardware rtx4090 --gpus 2 --finetune lora --stack torchtune" \
  fw plan --model llama3-8b --hardware rtx4090 --gpus 2 --finetune lora --stack torchtune
step "flopwise plan --model llama3-8b --hardware rtx4090 --gpus 2 --finetune lora --stack litgpt" \
  fw plan --model llama3-8b --hardware rtx4090 --gpus 2 --finetune lora --stack litgpt
step "flopwise hardware" fw hardware
step "flopwise hardware h100-sxm" fw hardware h100-sxm
step "flopwise models" fw models
step "flopwise plan --config configs/default.yaml --hardware h100-sxm" fw plan --config configs/default.yaml --hardware h100-sxm

# Train
step "flopwise train ($TRAIN)" fw train "$TRAIN"
expect_file runs/default/predicted_vs_measured.json
step "flopwise train configs/seed_example.yaml training.max_steps=50 logging.run_dir=runs/seed_example ($TRAIN)" \
  fw train configs/seed_example.yaml logging.run_dir=runs/seed_example "$TRAIN"
step "flopwise train parallel.strategy=ddp training.gradient_checkpointing=true logging.run_dir=runs/ddp ($TRAIN)" \
  fw train parallel.strategy=ddp training.gradient_checkpointing=true logging.run_dir=runs/ddp "$TRAIN"
step "flopwise train model.kind=hf model.hf_config=path/to/config.json data.paths='[my_corpus/]' logging.run_dir=runs/hf ($TRAIN)" \
  fw train model.kind=hf model.hf_config=path/to/config.json "data.paths=[my_corpus/]" logging.run_dir=runs/hf "$TRAIN"
step "flopwise train configs/deepspeed_zero3.yaml ($TRAIN)" fw train configs/deepspeed_zero3.yaml "$TRAIN"
step "flopwise train configs/pipeline_1f1b.yaml ($TRAIN)" fw train configs/pipeline_1f1b.yaml "$TRAIN"
step "flopwise export runs/default" fw export runs/default
expect_file runs/default/export/model.safetensors
step "flopwise generate runs/default --prompt \"def add(\" --max-new-tokens 24" \
  fw generate runs/default --prompt "def add(" --max-new-tokens 24
step "flopwise launch slurm configs/multi_node.yaml --out job.sbatch" \
  fw launch slurm configs/multi_node.yaml --out job.sbatch
expect_file job.sbatch
step "flopwise launch k8s configs/multi_node.yaml --image IMAGE" fw launch k8s configs/multi_node.yaml --image IMAGE

# Compress
step "flopwise compress --task digits-cnn --method int8-static" fw compress --task digits-cnn --method int8-static
step "flopwise compress runs/default --method int8-static" fw compress runs/default --method int8-static
step "flopwise compress configs/compress_prune.yaml" fw compress configs/compress_prune.yaml

# Diagnose
step "flopwise doctor" fw doctor
step "flopwise bench --op all_reduce" fw bench --op all_reduce
step "flopwise calibrate --nproc 2" fw calibrate --nproc 2
step "flopwise diagnose runs/default" fw diagnose runs/default
step "flopwise report runs/default" fw report runs/default
expect_file runs/default/report.md
expect_file runs/default/report.html

echo "tour: all ${#TIMES[@]} commands did what the README says (in $WORK/flopwise)"
if [ -n "${TOUR_RESULTS:-}" ]; then
  {
    echo "{\"training_steps\": $STEPS, \"setup_seconds\": ${SETUP_SECONDS:-null}, \"steps\": ["
    (IFS=,; echo "${TIMES[*]}")
    echo "]}"
  } > "$TOUR_RESULTS"
  echo "tour: times in $TOUR_RESULTS"
fi
