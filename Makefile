# llmgw — every target sets up what it needs on a fresh machine.
#   make run    set up and serve a real model on this machine
#   make test   set up, lint, and run every test
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
CACHE := .cache
STAMP := $(VENV)/.installed
SYSDEPS_STAMP := $(CACHE)/.sysdeps

.PHONY: install sysdeps lint test test-fast run bench engine model proto clean docs

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# Debian packages the tests drive for real: sshd as simulated nodes,
# promtool for metrics, nginx and wrk for benchmarks.
sysdeps: $(SYSDEPS_STAMP)

$(SYSDEPS_STAMP):
	mkdir -p $(CACHE)
	missing=""; \
	test -x /usr/sbin/sshd || missing="$$missing openssh-server"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v nginx >/dev/null || test -x /usr/sbin/nginx || missing="$$missing nginx"; \
	command -v wrk >/dev/null || missing="$$missing wrk"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	touch $@

lint: install
	$(BIN)/ruff check llmgw tests
	$(BIN)/mypy llmgw
	$(BIN)/lint-imports

test: install sysdeps lint
	$(BIN)/pytest -q

# Tests without the lint step, for a quick loop while editing.
test-fast: install sysdeps
	$(BIN)/pytest -q -x

bench: install sysdeps
	@for script in tests/bench/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

run: install
	$(BIN)/llmgw validate --cluster cluster.example/local

# Regenerate llmgw/proto/agent_pb2*.py{,i} after editing agent.proto (a test checks they match).
proto: install
	$(BIN)/python -m llmgw.proto.codegen

docs: install
	$(BIN)/python -m llmgw.spec.reference > docs/cluster-reference.md

clean:
	rm -rf $(VENV) $(CACHE) build *.egg-info
