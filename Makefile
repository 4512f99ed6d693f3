# Sluice: `make run` starts the whole local stack, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SLUICE_WORKERS ?= 2
SLUICE_ENGINE ?= mocker
export SLUICE_ENGINE

.PHONY: run test test-fast bench bench-router lint venv redis models clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

redis:
	./scripts/ensure_redis.sh --start

models: venv
	$(BIN)/sluice models prepare $${SLUICE_MODEL:-smollm2}

## The whole local stack (frontend on $SLUICE_PORT or 8000, $SLUICE_WORKERS workers, Flower on 5555).
run: venv redis models
	SLUICE_AUTH=$${SLUICE_AUTH:-0} $(BIN)/honcho start -f Procfile -c worker=$(SLUICE_WORKERS)

## Every test: unit, integration (private Redis), end to end (the stack as subprocesses).
test: venv
	./scripts/ensure_redis.sh
	$(BIN)/pytest -q -p no:cacheprovider

test-fast: venv
	$(BIN)/pytest -q -m "not e2e and not vllm"

bench: venv
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.frontend_bench

bench-router: venv
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.router_bench

lint: venv
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache bench/results
