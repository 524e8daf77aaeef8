# Set-up and the two commands the README promises. Everything installs into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
EXTRAS ?= test

.PHONY: install sweep test test-fast clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

# The main job: the up-training sweep on the small CPU benchmarks (embedded local Ray, SQLite
# MLflow and results DB under runs/uptrain-small), then the up-training table.
sweep: $(STAMP)
	$(PY) experiments/uptrain_sweep.py --config experiments/uptrain_small.yaml $(ARGS)

# The whole suite, slow end-to-end tests included (CI runs exactly this).
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15

# Everything but the slow end-to-end tests.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow"

clean:
	rm -rf $(VENV) .pytest_cache
