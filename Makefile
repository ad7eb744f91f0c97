# flowc developer entry points.  Needs python3 (>= 3.10) with the venv module
# (Debian: apt-get install python3-venv) and a C++ compiler (apt-get install g++).

PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
# The stamp is rebuilt only when the package metadata changes, so `make test`
# does not reinstall every time; the install is editable, so code edits need no
# reinstall either.
STAMP  := $(VENV)/.installed

.PHONY: venv lint test demo bench clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet -e '.[test,lint]'
	@touch $(STAMP)

# ruff and mypy, configured in pyproject.toml ([tool.ruff], [tool.mypy]: the packages flow and flowc).
lint: venv
	$(VPY) -m ruff check .
	$(VPY) -m mypy

test: venv
	$(VPY) -m pytest -q tests

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
