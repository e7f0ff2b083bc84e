# Two entry points: `make demo` and `make test`. Both create the virtual environment on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test setup clean-outputs

setup: $(STAMP)

# Re-install only when the pinned dependencies or the package metadata change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) run.py

test: $(STAMP)
	$(PY) -m pytest -q

clean-outputs:
	rm -rf outputs multirun
