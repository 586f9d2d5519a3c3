# Two entry points: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv and install what they need: torch 2.13.0 first (the CPU wheel on this
# machine; a bare `torch` would pull a multi-GB CUDA build), then this package.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mutransfer-installed
TEST_STAMP := $(VENV)/.mutransfer-test-installed

.PHONY: install demo quickstart test test-fast bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

# Tests also check Hugging Face models (optional extra), sweeps on PostgreSQL (optional extras;
# scripts/with-postgres.sh gives them a throwaway server) and compare against Microsoft's `mup`,
# installed with --no-deps: its metadata pulls torchvision, which breaks beside torch 2.13 CPU.
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[test,hf,sweep,postgres]"
	$(PY) -m pip install --quiet --no-deps mup==1.0.0
	touch $(TEST_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mutransfer demo

quickstart: $(STAMP)
	$(PY) examples/quickstart.py

test: $(TEST_STAMP)
	scripts/with-postgres.sh $(PY) -m pytest -q

test-fast: $(TEST_STAMP)
	scripts/with-postgres.sh $(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/coord_check_speed.py
	scripts/with-postgres.sh $(PY) benchmarks/sweep_throughput.py
	$(PY) benchmarks/depth_transfer.py
	$(PY) benchmarks/depth_overhead.py
	$(PY) benchmarks/limits_speed.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache mutransfer-demo
