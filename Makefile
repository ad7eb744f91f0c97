# flowc developer entry points.  Needs python3 (>= 3.10) with the venv module
# (Debian: apt-get install python3-venv) and a C++ compiler (apt-get install g++).

PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
# The distributed extra (mpi4py and the mpich wheel) is in the stamp so `make test` runs the
# multi-process tests too.  The stamp is rebuilt only when the package metadata changes, so `make test`
# does not reinstall every time; the install is editable, so code edits need no
# reinstall either.
STAMP  := $(VENV)/.installed

.PHONY: venv lint test test-fast test-slow demo bench clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet -e '.[test,lint,distributed]'
	@touch $(STAMP)

# ruff and mypy, configured in pyproject.toml ([tool.ruff], [tool.mypy]: the packages flow and flowc).
lint: venv
	$(VPY) -m ruff check .
	$(VPY) -m mypy

# The whole suite (11 to 14 minutes on 2 cores of the CI's kind): the test command the README gives.
test: venv
	$(VPY) -m pytest -q tests

# The edit loop (about 4 minutes on 2 cores): everything but the tests marked `slow` (training runs,
# subprocesses, nvcc / emulator / wheel builds) or `gpu` (tests/test_cuda_device.py).  It keeps every
# op against the reference, every gradient against finite differences, the golden generated code and
# single train steps through the compiled C++.  No -x: a change that breaks several ops should show
# them all; `make test-fast PYTEST_ARGS=-x` stops at the first failure instead.  Every run compiles
# into a fresh cache; FLOWC_TEST_CACHE_DIR=~/.cache/flowc-tests make test-fast keeps one warm across
# runs (see tests/conftest.py), so an unchanged tree skips the compiles of the run before.
test-fast: venv
	$(VPY) -m pytest -q -m "not slow and not gpu" tests $(PYTEST_ARGS)

# The rest: test-fast and test-slow together run what `make test` runs.
test-slow: venv
	$(VPY) -m pytest -q -m "slow or gpu" tests $(PYTEST_ARGS)

demo: venv
	$(VPY) examples/mlp_train_demo.py

# The peers (PyTorch, JAX) and matplotlib come with the `bench` extra, installed here once per
# change of setup.cfg; `make bench BENCH_ARGS="--rounds 1"` passes options to the driver.
bench: venv
	@test $(VENV)/.installed-bench -nt setup.cfg || { $(VPY) -m pip install --quiet -e '.[test,bench]' && touch $(VENV)/.installed-bench; }
	$(VPY) -m benchmarks.run_bench $(BENCH_ARGS)

# Removes build outputs in the tree only; the kernel cache ($$FLOWC_CACHE_DIR or
# ~/.cache/flowc) is left alone: delete that directory to empty it.
clean:
	rm -rf $(VENV) build dist .eggs *.egg-info .pytest_cache .benchmarks benchmarks/results
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
