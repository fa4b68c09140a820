# One entry point for every task. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
BUF := node_modules/.bin/buf
NODE_CLIENT := clients/node
TS_CLIENT := clients/ts
GENERATED := clients/python/agentloop/v1 clients/python/agentloop/plugin/v1 $(TS_CLIENT)/src/gen
PROTOS := $(sort $(shell find proto -name '*.proto'))
SERVICE_PROTOS := $(shell grep -l '^service ' $(PROTOS))
CONFIG ?=
LISTEN ?=
# pytest-xdist workers: one per core (at most 4); TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= auto

.DEFAULT_GOAL := help
.PHONY: help setup run cluster test check lint typecheck gen check-gen seam-table breaking baseline bench peers clean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip uninstall --quiet --yes agentloop  # the one distribution of before the split
	$(PY) -m pip install --quiet -e clients/python  # the SDK first: the server depends on it
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --silent --no-audit --no-fund
	touch $@

$(NODE_CLIENT)/node_modules/.installed: $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	cd $(NODE_CLIENT) && npm ci --silent --no-audit --no-fund
	touch $@

$(TS_CLIENT)/node_modules/.installed: $(TS_CLIENT)/package.json $(TS_CLIENT)/package-lock.json
	cd $(TS_CLIENT) && npm ci --silent --no-audit --no-fund
	touch $@

setup: $(VENV)/.installed node_modules/.installed $(NODE_CLIENT)/node_modules/.installed $(TS_CLIENT)/node_modules/.installed ## Create .venv and install Python and Node dependencies.

run: $(VENV)/.installed ## Start the server (127.0.0.1:50051, scripted model); CONFIG=file, LISTEN=host:port.
	$(PY) -m server $(if $(CONFIG),--config $(CONFIG),) $(if $(LISTEN),--listen $(LISTEN),)

REPLICAS ?= 3
cluster: $(VENV)/.installed ## An embedded PostgreSQL and REPLICAS replicas on 127.0.0.1:50061+ (Ctrl-C stops).
	$(PY) -m server.cluster.devcluster --replicas $(REPLICAS)

test: setup ## Run lint, type checks and the whole test suite (what CI runs).
	$(MAKE) --no-print-directory check-gen lint typecheck breaking
	$(BIN)/pytest -q -n $(TEST_WORKERS) --maxprocesses=4
	npm test --prefix $(NODE_CLIENT)
	npm test --prefix $(TS_CLIENT)

gen: $(VENV)/.installed node_modules/.installed $(TS_CLIENT)/node_modules/.installed ## Regenerate the Python and TypeScript code from proto/.
	rm -rf clients/python/agentloop/v1/*_pb2* clients/python/agentloop/plugin/v1/*_pb2*
	PATH=$(abspath $(BIN)):$$PATH $(PY) -m grpc_tools.protoc -I proto \
		--python_out=clients/python --mypy_out=quiet:clients/python $(PROTOS) \
		--include_source_info --include_imports \
		--descriptor_set_out=clients/python/agentloop/v1/agentloop.binpb
	PATH=$(abspath $(BIN)):$$PATH $(PY) -m grpc_tools.protoc -I proto \
		--grpc_python_out=clients/python --mypy_grpc_out=quiet:clients/python $(SERVICE_PROTOS)
	cd $(TS_CLIENT) && ../../$(BUF) generate

check-gen: gen ## Fail when the committed generated code is stale.
	git diff --exit-code --stat -- $(GENERATED)
	@test -z "$$(git status --porcelain --untracked-files=all -- $(GENERATED))" || \
		{ git status --porcelain -- $(GENERATED); echo 'generated code is stale: run make gen and commit'; exit 1; }

seam-table: $(VENV)/.installed ## Regenerate proto/README.md's seam table from the proto's descriptors.
	$(PY) -m tests.seam_table --write

lint: setup ## ruff (lint and format), the import contract of the layers, buf (lint and format).
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	cd proto && ../$(BUF) lint
	cd proto && ../$(BUF) format -d --exit-code

breaking: node_modules/.installed ## Fail on a wire- or source-breaking change against proto/baseline.binpb.
	cd proto && ../$(BUF) breaking --against baseline.binpb

baseline: node_modules/.installed ## Refresh the compatibility baseline (a deliberate, changelogged decision).
	cd proto && ../$(BUF) build -o baseline.binpb

typecheck: $(VENV)/.installed ## mypy --strict.
	$(BIN)/mypy

QUICK ?=
bench: $(VENV)/.installed ## Run every benchmark (bench/suite.py) and print its figures; QUICK=1: CI-sized runs.
	$(PY) -m bench.suite $(if $(QUICK),--quick,)

PEERS_VENV := .venv-peers
peers: $(PEERS_VENV)/.installed ## A virtualenv with the peers bench.peers_bench compares with (bench/peers/requirements.txt).

$(PEERS_VENV)/.installed: bench/peers/requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet -r bench/peers/requirements.txt
	touch $@

clean: ## Remove the virtualenvs and caches.
	rm -rf $(VENV) $(PEERS_VENV) node_modules $(NODE_CLIENT)/node_modules $(TS_CLIENT)/node_modules $(TS_CLIENT)/dist .mypy_cache .ruff_cache .pytest_cache
