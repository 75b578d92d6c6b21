PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: install test test-kernels test-fast demo bench browser postgres clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch is pinned through constraints.txt (the CPU build on this machine); pyproject takes a range.
# The demo and benchmarks need the package only; the tests also need its dev extras (oracles, Dask).
$(RUN_STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The HTML report test renders in headless Chromium (Debian's package; needs root or sudo); the
# service's browser test drives it through chromium-driver (selenium).
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }

# The service's tests start their own PostgreSQL server from Debian's package (initdb + pg_ctl in a
# temporary directory; tests/service/postgres.py).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq postgresql >/dev/null; }

# Two worker processes (the CI machine's 2 cores; every test computes on one thread), whole files per worker so a
# module's expensive fixtures are built once. TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2
test: $(STAMP) browser postgres
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# The suite once more on other CPU kernels than this machine's (no test may depend on which ones run): ATen's
# portable level, and MKL and oneDNN held to SSE4.2 (no FMA), which round matmuls unlike both AVX2 and AVX-512.
# .ci/run runs it after `make test`, so a kernel-dependent test fails where it can be seen.
KERNELS := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41
test-kernels: $(STAMP) browser postgres
	$(KERNELS) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# For development: everything but the slow-marked coverage simulations and end-to-end runs
# (`make test` runs them all; CI runs `make test`). One folder per package: tests/circuits, stats, ...
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" tests

demo: $(RUN_STAMP)
	$(BIN)/circuitstat demo

bench: $(RUN_STAMP)
	$(BIN)/python bench/attribution.py
	$(BIN)/python bench/bootstrap.py
	$(BIN)/python bench/training.py
	$(BIN)/python bench/startup.py

clean:
	rm -rf $(VENV) .pytest_cache
