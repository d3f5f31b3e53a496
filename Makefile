# Quick start: `make demo` runs the main job on an embedded tiny default; `make test` runs the tests.
# Both create .venv and install what they need. torch==2.13.0 is installed first on purpose: an unpinned
# torch requirement pulls several GB of CUDA wheels. Use any torch >= 2.4 build for your accelerator with
# `make TORCH_SPEC="torch==2.5.1" ...` or by installing it in .venv yourself.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

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

clean:
	rm -rf $(VENV) demo_output build dist *.egg-info
