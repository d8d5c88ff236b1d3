# Two entry points for a fresh machine: `make run` (the main job) and `make test`.
# Each creates .venv and installs what it needs on first use.
PY ?= python3
VENV := .venv
CUDA ?= 13
TORCH_SPEC ?= torch
STAMP := $(VENV)/.installed-cuda$(CUDA)
ARGS ?=

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/pip install -q -e ".[cuda$(CUDA),dev,cluster]"
	touch $(STAMP)

.PHONY: setup run test lint
setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/python run_agent.py run $(ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
