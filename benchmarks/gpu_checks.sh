#!/usr/bin/env bash
# The checks that need a GPU, in one run (the device machine of a development session, or any CUDA box), most
# important first, each section bounded by its own limit and by the run's deadline (GPU_DEADLINE seconds, default
# 420): gpu-marked tests, the training benchmark on CUDA (bf16, and fp16 + GradScaler, mid size), the quantized-storage
# benchmark on CUDA (torchao, quanto, GGUF, bitsandbytes, fp8 compute), a real-size SD 1.5 UNet LoRA step, the whole
# suite on the CUDA machine, and (given a diffusers example script) the training program's GPU checks. Results go to
# ${OUT:-gpu_out}.
#   bash benchmarks/gpu_checks.sh [DIFFUSERS_TRAIN_SCRIPT]
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
END=$(( $(date +%s) + ${GPU_DEADLINE:-420} ))
left() { local l=$(( END - $(date +%s) )); (( l < $1 )) && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
section() { local name=$1 limit=$2; shift 2; echo "== $name ($(left "$limit") s max)"; local t0=$(date +%s)
  timeout "$(left "$limit")" "$@" 2>&1 | tee "$OUT/$name.txt" | tail -${TAIL:-30}; echo "== $name: rc ${PIPESTATUS[0]}, $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch, diffusers, transformers, peft, accelerate; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)" | tee -a "$OUT/gpu.txt"
section gpu_tests 150 $PY -m pytest -q -m gpu -p no:cacheprovider -o addopts="-ra" tests
section bench_bf16 90 $PY benchmarks/bench_training.py --device cuda --layout h100 --sizes mid --steps 30
section bench_fp16 60 $PY benchmarks/bench_training.py --device cuda --layout t4 --sizes mid --steps 10
section bench_quantize 120 $PY benchmarks/bench_quantize.py --device cuda --trained-steps 40 --calls 20
section train_step_real 120 $PY benchmarks/train_step_real.py --device cuda --steps 6
TAIL=40 section suite 400 $PY -m pytest -q -n 12 --dist loadfile -p no:cacheprovider --maxfail=40
[ -n "${1:-}" ] && section train_checks 200 $PY benchmarks/train_checks.py --out "$OUT/checks" --device cuda --diffusers-script "$1"
exit 0
