# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install lint interop compose-test compiled compiled-test

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/flotilla up --demo

# Two phases: the suite on every core (pytest-xdist), then the tests whose assertions need the machine
# to themselves (timing, floods, the long live runs: markers serial and slow) one at a time.
TEST_WORKERS ?= 2

test: install
	./scripts/ensure-prometheus.sh
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not serial and not slow"
	$(BIN)/python -m pytest -q -m "serial or slow"

# Optional: the request path compiled with mypyc, as a wheel and the image have it (setup.py,
# docs/proxy.md "The compiled build"), installed into build/compiled beside the working tree, which
# stays plain Python (an editable install never compiles; about 30 s).
compiled: install
	$(BIN)/python -m bench.compiled

# The proxy's tests against the compiled build: run from build/compiled, whose modules then come
# first on sys.path (pytest appends the repository instead of prepending it); test_build.py checks
# the compiled modules are the ones loaded.
compiled-test: compiled
	cd build/compiled && FLOTILLA_EXPECT_COMPILED=1 $(abspath $(BIN))/python -m pytest -q -p no:cacheprovider \
		-n $(TEST_WORKERS) --rootdir $(CURDIR) -c $(CURDIR)/pyproject.toml --import-mode=append \
		-m "not serial and not slow" $(CURDIR)/tests/proxy

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Optional: Flotilla in front of real llama-server and real vLLM for CPU (docs/interop.md). Builds
# or reuses them under $${FLOTILLA_INTEROP_CACHE:-~/.cache/flotilla/interop} (about 15 min the first
# time on 2 cores, seconds after), makes tiny random-weight models, then runs tests/interop.
interop: install
	./scripts/interop/prepare.sh
	FLOTILLA_INTEROP=1 $(BIN)/python -m pytest -q -p no:cacheprovider --timeout 900 tests/interop $(INTEROP_ARGS)

# Optional: `docker compose up` for real, on podman with the real Compose binary (docs/quickstart.md):
# builds the image, starts compose.yaml, checks the fleet from the host, takes it down, then shows
# a broken scrape target fails the check. Root only; podman, its storage and the local base images
# are cached under $${FLOTILLA_COMPOSE_CACHE:-~/.cache/flotilla/compose} (about 5 min the first time
# on 2 cores, the image compiling the request path; about 3 min after).
compose-test: install
	$(BIN)/python -m tests.compose.run $(COMPOSE_TEST_ARGS)
	FLOTILLA_COMPOSE_TEST=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/compose
