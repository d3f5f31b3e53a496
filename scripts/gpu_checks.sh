#!/usr/bin/env bash
# The checks that need a GPU, in one run (the device machine of a development session, or any CUDA box):
# gpu-marked tests, the training benchmark on CUDA (bf16 and fp16 + GradScaler layouts, mid size), a real-size
# SD 1.5 UNet LoRA step, and the training program's GPU checks. Each section has its own time limit; results go to
# ${OUT:-gpu_out}.
#   bash scripts/gpu_checks.sh [DIFFUSERS_TRAIN_SCRIPT]
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch, diffusers, transformers, peft, accelerate; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)" | tee -a "$OUT/gpu.txt"
timeout 120 $PY -m pytest -q -m gpu -p no:cacheprovider -o addopts="-ra" --continue-on-collection-errors tests 2>&1 | tail -25 | tee "$OUT/gpu_tests.txt"
timeout 120 $PY scripts/bench_training.py --device cuda --layout h100 --sizes mid --steps 30 2>&1 | tail -30 | tee "$OUT/bench_bf16.txt"
timeout 80 $PY scripts/bench_training.py --device cuda --layout t4 --sizes mid --steps 10 2>&1 | tail -30 | tee "$OUT/bench_fp16.txt"
timeout 170 $PY scripts/train_step_real.py --device cuda --steps 6 2>&1 | grep '^{' | tee "$OUT/train_step_real.txt"
timeout 200 $PY scripts/train_checks.py --out "$OUT/checks" --device cuda ${1:+--diffusers-script "$1"} 2>&1 | grep "^==" | cut -c1-1500 | tee "$OUT/train_checks.txt"
