# Quick start: `make demo` runs the main job on an embedded tiny default; `make test` runs the tests.
# Both create .venv and install what they need. torch==2.13.0 is installed first on purpose: an unpinned
# torch requirement pulls several GB of CUDA wheels. Use any torch >= 2.4 build for your accelerator with
# `make TORCH_SPEC="torch==2.5.1" ...` or by installing it in .venv yourself.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Tests whose expectation depends on the CPU the device probe sees (marked `probe`) run once more as an AMX CPU
# and once as an AVX512 CPU without AMX/AVX512-BF16/AVX512-FP16 (HF_PRECISION_CPU_FLAGS, see
# hf_precision/recipe/devices.py), so a machine of either kind checks both; `make test` covers this machine as it is.
AMX_FLAGS ?= avx2,avx512f,avx512_bf16,amx_tile,amx_bf16
NO_AMX_FLAGS ?= avx2,avx512f

.PHONY: demo test test-cpus install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test,video]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hf-precision demo --out demo_output

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-cpus: $(STAMP)
	HF_PRECISION_CPU_FLAGS="$(AMX_FLAGS)" $(BIN)/python -m pytest -q -m probe
	HF_PRECISION_CPU_FLAGS="$(NO_AMX_FLAGS)" $(BIN)/python -m pytest -q -m probe

clean:
	rm -rf $(VENV) demo_output build dist *.egg-info
