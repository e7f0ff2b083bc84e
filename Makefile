# Two entry points: `make demo` and `make test`. Both create the virtual environment on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-numeric lint format setup clean-outputs reproduce

setup: $(STAMP)

# Re-install only when the pinned dependencies or the package metadata change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

# The demo is the language track at demo size (conf/experiment/demo_text.yaml); `$(PY) run.py` alone runs
# the digits ViTs.
demo: $(STAMP)
	$(PY) run.py experiment=demo_text

# Two test processes (one per core on a 2-core machine), each file's tests in one of them (module
# fixtures are built once), one torch thread each: tiny models gain nothing from intra-op threads.
# test-numeric runs at torch's own thread count.
test: $(STAMP)
	OMP_NUM_THREADS=1 GLMC_TEST_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile

# The tests that compare floats computed two ways; CI runs them again on the CPU's plain kernels
# (ATEN_CPU_CAPABILITY=default) so that tolerances never rest on one instruction set.
test-numeric: $(STAMP)
	$(PY) -m pytest -q -m numeric

# Every table and figure of paper 001 (finished runs are reused), then REPORT.md from their sections.
reproduce: $(STAMP)
	$(PY) experiments/reproduce.py all && $(PY) experiments/reproduce.py --report

# Lint and formatting as CI checks them; `make format` rewrites the files instead.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean-outputs:
	rm -rf outputs multirun
