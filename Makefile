# One entry point for every task. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
BUF := node_modules/.bin/buf
NODE_CLIENT := clients/node
GENERATED := clients/python/agentloop/v1 clients/python/agentloop/plugin/v1
PROTOS := $(sort $(shell find proto -name '*.proto'))
SERVICE_PROTOS := $(shell grep -l '^service ' $(PROTOS))
CONFIG ?=

.DEFAULT_GOAL := help
.PHONY: help setup run test check lint typecheck gen check-gen bench clean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --silent --no-audit --no-fund
	touch $@

$(NODE_CLIENT)/node_modules/.installed: $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	cd $(NODE_CLIENT) && npm ci --silent --no-audit --no-fund
	touch $@

setup: $(VENV)/.installed node_modules/.installed $(NODE_CLIENT)/node_modules/.installed ## Create .venv and install Python and Node dependencies.

run: $(VENV)/.installed ## Start the server on its defaults (127.0.0.1:50051, scripted model).
	$(PY) -m server $(if $(CONFIG),--config $(CONFIG),)

test: setup ## Run lint, type checks and the whole test suite (what CI runs).
	$(MAKE) --no-print-directory check-gen lint typecheck
	$(BIN)/pytest -q
	npm test --prefix $(NODE_CLIENT)

gen: $(VENV)/.installed ## Regenerate the Python code from proto/.
	rm -rf clients/python/agentloop/v1/*_pb2* clients/python/agentloop/plugin/v1/*_pb2*
	PATH=$(abspath $(BIN)):$$PATH $(PY) -m grpc_tools.protoc -I proto \
		--python_out=clients/python --mypy_out=quiet:clients/python $(PROTOS)
	PATH=$(abspath $(BIN)):$$PATH $(PY) -m grpc_tools.protoc -I proto \
		--grpc_python_out=clients/python --mypy_grpc_out=quiet:clients/python $(SERVICE_PROTOS)

check-gen: gen ## Fail when the committed generated code is stale.
	git diff --exit-code --stat -- $(GENERATED)
	@test -z "$$(git status --porcelain --untracked-files=all -- $(GENERATED))" || \
		{ git status --porcelain -- $(GENERATED); echo 'generated code is stale: run make gen and commit'; exit 1; }

lint: setup ## ruff (lint and format) and buf (lint and format).
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cd proto && ../$(BUF) lint
	cd proto && ../$(BUF) format -d --exit-code

typecheck: $(VENV)/.installed ## mypy --strict.
	$(BIN)/mypy

bench: $(VENV)/.installed ## Run the performance benchmarks and print their figures.
	$(PY) -m bench.loop_bench
	$(PY) -m bench.plugin_bench
	$(PY) -m bench.telemetry_bench
	$(PY) -m bench.load_bench --seconds 6

clean: ## Remove the virtualenv and caches.
	rm -rf $(VENV) node_modules $(NODE_CLIENT)/node_modules .mypy_cache .ruff_cache .pytest_cache
