# Two entry points: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv and install what they need: torch 2.13.0 first (the CPU wheel on this
# machine; a bare `torch` would pull a multi-GB CUDA build), then this package.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mutransfer-installed
TEST_STAMP := $(VENV)/.mutransfer-test-installed

.PHONY: install demo quickstart test test-fast lint docs bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

# Tests also check Hugging Face models (optional extra), sweeps on PostgreSQL (optional extras;
# scripts/with-postgres.sh gives them a throwaway server) and compare against Microsoft's `mup`,
# installed with --no-deps: its metadata pulls torchvision, which breaks beside torch 2.13 CPU.
# timm (the zoo tests) also needs torchvision at import, and PyPI's torchvision is a CUDA build that
# pulls a CUDA torch: timm goes in with --no-deps, torchvision's pure-Python part into its own
# folder that tests/zoo.py puts on sys.path (its compiled ops stay absent; timm's models do not use
# them). The last line fails the install if anything replaced the CPU torch.
$(TEST_STAMP): $(STAMP) Makefile
	$(PY) -m pip install --quiet -e ".[test,hf,postgres,optimizers,cluster,docs,dev,monitor]" torch==2.13.0
	$(PY) -m pip install --quiet --no-deps mup==1.0.0 timm==1.0.31
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(VENV)/torchvision-pyonly torchvision==0.28.0
	$(PY) -c "import torch, sys; sys.exit(0 if torch.__version__ == '2.13.0+cpu' else 'torch was replaced: ' + torch.__version__)"
	touch $(TEST_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mutransfer demo

quickstart: $(STAMP)
	$(PY) examples/quickstart.py

# What CI runs (.ci/run): the fast checks first (lint, types, the docs site), then every test, one
# pytest-xdist worker per core (each test process keeps torch at one thread: tests/conftest.py).
test: $(TEST_STAMP) lint docs
	scripts/with-postgres.sh $(PY) -m pytest -q -n auto --dist worksteal --durations=15

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples scripts docs/hooks
	$(VENV)/bin/ruff format --check src tests benchmarks examples scripts docs/hooks
	$(VENV)/bin/mypy

# The documentation site (mkdocs-material + mkdocstrings), --strict: a broken link or reference fails.
docs: $(TEST_STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

test-fast: $(TEST_STAMP)
	scripts/with-postgres.sh $(PY) -m pytest -q -n auto --dist worksteal -m "not slow"

bench: $(TEST_STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/coord_check_speed.py
	scripts/with-postgres.sh $(PY) benchmarks/sweep_throughput.py
	$(PY) benchmarks/depth_transfer.py
	$(PY) benchmarks/depth_overhead.py
	$(PY) benchmarks/limits_speed.py
	$(PY) benchmarks/coord_power.py
	$(PY) benchmarks/meta_target.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache site mutransfer-demo
