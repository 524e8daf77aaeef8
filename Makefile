# Set-up and the two commands the README promises. Everything installs into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
EXTRAS ?= test

CUDA_AOT   = .cuda-aot
CUDA_STAMP = $(CUDA_AOT)/.installed

.PHONY: install cuda-aot sweep sweep-full test test-fast aot clean

# --no-compile: no .pyc for every installed file (most of a fresh install's time:
# benchmarks/results/cpu/NOTES.md); the modules a run imports write their own on first import.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

# XLA's CUDA compiler for this jaxlib (and ptxas), beside .venv rather than in it: what
# flurka.speed.aot compiles for a GPU target with, on a host without one (in .venv the plugin
# would try to start a CUDA backend in every process).
$(CUDA_STAMP): $(STAMP)
	JAXLIB=$$($(PY) -c 'import jaxlib; print(jaxlib.__version__)') && \
	$(PY) -m pip install -q --no-deps --upgrade --target $(CUDA_AOT) "jax-cuda12-plugin==$$JAXLIB" \
	    "jax-cuda12-pjrt==$$JAXLIB" "nvidia-cuda-nvcc-cu12>=12.8,<13"
	touch $(CUDA_STAMP)

cuda-aot: $(CUDA_STAMP)

# Compile speed points or the fused kernels' launch shapes for a GPU that is not here
# (python -m flurka.speed.aot --help): memory, kernels, registers and spills.
aot: $(CUDA_STAMP)
	PYTHONPATH=$(CUDA_AOT) $(PY) -m flurka.speed.aot $(ARGS)

# The main job: Table 5's observations on nmt-list-small, one variant at three α over 3 seeds
# (embedded local Ray, SQLite MLflow and results DB under runs/uptrain-small), then the
# up-training tables with their CIs and the three observations.
sweep: $(STAMP)
	$(VENV)/bin/flurka sweep --config uptrain-small $(ARGS)

# Table 5 whole: 3 variants x 7 alpha x 2 d_k x 3 seeds on nmt-list-small (its time: README).
sweep-full: $(STAMP)
	$(VENV)/bin/flurka sweep --config uptrain-full $(ARGS)

# Lint (ruff, pyproject's [tool.ruff]), then the whole suite, slow end-to-end tests included
# (CI runs exactly this).
test: $(STAMP) $(CUDA_STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --durations=15

# Everything but the slow end-to-end tests.
test-fast: $(STAMP) $(CUDA_STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 -m "not slow"

clean:
	rm -rf $(VENV) $(CUDA_AOT) .pytest_cache
