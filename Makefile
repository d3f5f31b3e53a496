# Quick start: `make demo` runs the main job on an embedded tiny default; `make test` runs the tests.
# Both create .venv and install what they need. torch==2.13.0 is installed first on purpose: an unpinned
# torch requirement pulls several GB of CUDA wheels. Use any torch >= 2.4 build for your accelerator with
# `make TORCH_SPEC="torch==2.5.1" ...` or by installing it in .venv yourself.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make test` and `make demo` install the versions the suite was last green with (constraints.txt, refreshed on
# purpose with `make lock` after `make test-latest` passes); `make test-latest` runs the suite in .venv-latest
# against the newest releases, so a dependency's new release shows up there first, not on a new user's machine.
CONSTRAINTS ?= constraints.txt
LATEST_VENV ?= .venv-latest
# torch and the packages only torch pins are left to TORCH_SPEC (another torch build brings its own).
LOCK_SKIP := ^(torch|triton|nvidia-[a-z0-9_-]+|sympy|mpmath|networkx|jinja2|markupsafe|fsspec|filelock|typing.extensions|setuptools|pip)==

# The suite runs in TEST_WORKERS processes (pytest-xdist, --dist worksteal: each worker starts on its own share of
# the tests, in file order so module fixtures are built once, and takes tests from the other's end when it runs dry,
# so no long file left to the end keeps one worker busy while the other waits; the longest modules come first,
# tests/conftest.py SLOW_MODULES, and the demo runs once for both workers); 2 fits the 2-core CI machine;
# `make test TEST_WORKERS=0` runs it in this process alone. It ends with the 20 slowest tests, so what CI time goes
# to stays in every run's log.
TEST_WORKERS ?= 2

.PHONY: demo test test-heavy test-latest lock install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e ".[test,video]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hf-precision demo --out demo_output

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=20 -m "not heavy"

# The tests of the most CPU each (marked `heavy`), kept out of `make test` so CI stays near 15 minutes on 2 cores:
# the multi-process runs the suite has a lighter twin of (README's accelerate launch commands, a prompt file over 2
# processes, a sharded 2-process training run, its live kill / Ctrl-C and resume, a 3-process uneven shard resumed at
# 2 and 1 processes), the README's benchmark commands (tests/test_benchmark.py runs the
# benchmark), a second demo layout, torch.compile, the measured-vs-predicted training step, the real Wan config's
# plan, the docs' SDXL training plan, quanto int4/int2 (they build quanto's C++ unpacker on first use); the commands and
# Python blocks of docs/*.md and of the --help examples that do a model's work, the benchmarks they name at their
# smallest and the docs' real Wan plan (tests/test_docs_examples.py: in `make test` their arguments parse, and the
# README's commands run each program).
test-heavy: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m heavy

# The newest releases of every dependency (torch stays TORCH_SPEC), in a venv of their own.
test-latest:
	test -x $(LATEST_VENV)/bin/python || $(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)"
	echo "$(TORCH_SPEC)" > $(LATEST_VENV)/torch-spec.txt  # an eager upgrade would otherwise replace torch too
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -c $(LATEST_VENV)/torch-spec.txt \
		-e ".[test,video]"
	$(LATEST_VENV)/bin/python -m pytest -q

# Pin what .venv-latest just passed with (run `make test-latest` first; commit constraints.txt saying so).
lock:
	grep '^#' $(CONSTRAINTS) > $(CONSTRAINTS).new
	$(LATEST_VENV)/bin/python -m pip freeze --exclude-editable | grep -v -i -E '$(LOCK_SKIP)' >> $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

clean:
	rm -rf $(VENV) $(LATEST_VENV) demo_output build dist *.egg-info
