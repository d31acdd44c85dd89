# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install lint interop

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/flotilla up --demo

test: install
	./scripts/ensure-prometheus.sh
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Optional: Flotilla in front of real llama-server and real vLLM for CPU (docs/interop.md). Builds
# or reuses them under $${FLOTILLA_INTEROP_CACHE:-~/.cache/flotilla/interop} (about 15 min the first
# time on 2 cores, seconds after), makes tiny random-weight models, then runs tests/interop.
interop: install
	./scripts/interop/prepare.sh
	FLOTILLA_INTEROP=1 $(BIN)/python -m pytest -q -p no:cacheprovider --timeout 900 tests/interop $(INTEROP_ARGS)
