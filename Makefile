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

.PHONY: demo test graphviz install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(VENV)/bin/pip install -e ".[test]"
	touch $(STAMP)

graphviz:
	@sh tools/ensure_graphviz.sh

demo: install graphviz
	$(VENV)/bin/hybridflow quickstart

test: install graphviz
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=12 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) out runs .pytest_cache .hypothesis
