# kvx — build, test, demo, bench, proto.
GO      ?= go
BIN     := $(CURDIR)/bin
TOOLS   := $(BIN)/tools
export PATH := $(TOOLS):$(PATH)

# Every go command here builds with -trimpath, as make build's release
# binaries are: a package compiled once (by build, vet, the tests, or a
# test's own go build of a plugin) is then reused by all the others, where
# differing flags would compile the whole tree three times over on a cold
# cache.
ifeq ($(filter -trimpath,$(GOFLAGS)),)
GOFLAGS := $(strip -trimpath $(GOFLAGS))
endif
export GOFLAGS

# go-nvml's header (core/gpumem) marks some NVML calls deprecated; cgo
# would print a warning for each on every cold build and vet.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: help all build test test-plain test-short test-race soak bench-smoke fmt-check demo bench proto tools vet clean

# Packages that run goroutines of their own (plugin transport and data
# plane, the SDK's signal handling, host, engine with started calls and step
# overlap, setup's launcher, the cpu kernels' parallel loops, kvx bench's
# request loops) or drive them over a real gRPC pair (the conformance
# suite): the race detector runs their tests. The other device packages
# (synth, hf, sim, paged), the worker runtime (device/: its tests run the
# sim device, with no goroutine, channel, lock or atomic in the package or
# its tests), the pipeline helpers (plugins/v1/pipeline: likewise) and the
# contract's type packages start no goroutine, so the race detector has
# nothing to find in them: their tests run in the plain pass only.
RACE_PKGS := ./core/host/ ./core/engine/ ./core/setup/ ./core/bench/ ./plugins/internal/plane/ ./plugins/sdk/ \
	./plugins/v1/pluginrpc/ ./plugins/conformance/ ./device/cpu/...

all: build

## help: the targets and what each does (their ## comments)
help:
	@awk '/^## [a-z0-9-]+: / { if (t) printf "  %-13s %s\n", t, d; t = $$2; sub(/:$$/, "", t); d = substr($$0, length($$2) + 5); next } \
	  /^## / && t { d = d " " substr($$0, 4); next } { if (t) printf "  %-13s %s\n", t, d; t = "" } \
	  END { if (t) printf "  %-13s %s\n", t, d }' $(MAKEFILE_LIST)

# VERSION is what kvx --version prints first (main.version); the build's
# VCS revision comes from the Go build info where GOFLAGS allows it.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

## build: kvx and every plugin binary into ./bin
build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags='-X main.version=$(VERSION)' -o $(BIN)/ ./cmd/...

## tools: what the tests need beyond Go (protoc and its Go generators)
# The generators are built one after the other (-j1, also under make -j):
# the second reuses the protogen packages the first compiled.
tools:
	@command -v protoc >/dev/null 2>&1 || { \
	  echo "installing protobuf-compiler (protoc) with apt-get"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler) >/dev/null || \
	  echo "warning: could not install protoc; the generated-code staleness test will be skipped"; }
	@$(MAKE) --no-print-directory -j1 proto-tools

## vet: go vet over everything
vet:
	$(GO) vet ./...

## fmt-check: fail when a Go file is not gofmt-formatted
fmt-check:
	@out="$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go' 2>/dev/null || find . -name '*.go'))"; \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# make test runs its passes side by side (make -j), so one's waits (plugin
# processes, deadlines, the soak's clients) are filled by another's
# compiling; lines are kept whole:
#   - the race pass from the start, beside make build: it compiles its own
#     copy of every package (-race), so the two share nothing to wait for;
#   - after make build, the plain pass, the generators (which build against
#     the protobuf make build has just compiled) and the example plugins.
# The plain pass vets as it tests (-vet=all: every analyzer go vet runs,
# over the same packages, ./..., on the packages it has just compiled for
# the tests, where a separate go vet would load and type-check them all
# again); make vet stays for a vet on its own. It runs up to TEST_P test
# binaries at once (go test's default is one per core), since the long
# ones mostly wait. The benchmarks are not in it: make bench-smoke runs
# each once, and .ci/run runs it after make test (at one iteration the
# managers' benchmarks still replay every bundled scenario in process and
# as plugins, about 70 CPU-s, more than a tenth of make test's time on a
# cold cache). Tests that run kvx and
# the plugins as processes use the binaries make build has just made
# ($(TESTBIN_ENV)). Test binaries are linked without DWARF (-ldflags=-w):
# no test reads it, and it is about a third of a link's CPU (cmd/kvx's test
# binary: 3.4 s with DWARF, 2.4 s without); stack traces come from
# the symbol table, which stays.

## test: formatting, vet, the whole suite, the concurrent packages under the
## race detector, and the example plugins proved against v1 and gqa (sim and
## cpu devices; no GPU needed); CI also runs bench-smoke and fuzz
test: fmt-check
	@$(MAKE) --no-print-directory -j4 --output-sync=line test-plain test-race examples

TEST_P ?= 4

# test-plain: make test's plain pass, vet and every test once.
test-plain: build
	@$(MAKE) --no-print-directory tools
	$(TESTBIN_ENV) $(GO) test $(TEST_EXEC) -vet=all -p $(TEST_P) -ldflags=-w -timeout 15m -count=1 ./...

# The test binaries of both passes (and the kvx processes they start; a
# plugin gets none of kvx's environment but the GPU's and TMPDIR) collect
# garbage at GOGC=400 up to a heap of 1 GiB (GOMEMLIMIT), rather than at
# each doubling of the live heap; no test's check depends on when the
# collector runs. Measured side by side under the same load: core/engine's
# tests 19.0 -> 14.5 CPU-s (peak RSS 257 -> 584 MB); at GOGC=400 alone
# cachemgr_v2's 3.5 -> 2.4 and mamba's 5.8 -> 5.5; those whose work is in
# plugin processes (plugins/conformance, core/equiv) about the same.
TEST_EXEC := -exec 'env GOGC=400 GOMEMLIMIT=1GiB'

# What the tests that need kvx's binaries are told after make build: use
# these (core/testbin links them instead of building them again).
TESTBIN_ENV := KVXTEST_BIN_DIR=$(BIN)

## test-short: the suite without its long randomized runs
test-short: build
	$(TESTBIN_ENV) $(GO) test -short -count=1 ./...

## test-race: the packages with goroutines of their own, under -race (short mode)
# The race pass shares no compiled package with the others (-race compiles
# its own copy of everything), so it compiles without DWARF
# (-gcflags=all=-dwarf=false: a race report's stacks come from the symbol
# table, which stays), and its compiler runs with GOGC=800 (RACE_TOOLGC,
# through -toolexec, which the test binaries do not see). Each takes a
# sixth to an eighth off its compiling on a cold cache (measured in pairs:
# 112 -> 93 CPU-s without DWARF, 119 -> 102 with GOGC=800); the other go
# commands share make build's packages, and GOGC=800 gained them nothing.
test-race:
	$(GO) test $(RACE_TOOLGC) $(TEST_EXEC) -vet=off -race -short -gcflags=all=-dwarf=false -ldflags=-w -timeout 15m -count=1 $(RACE_PKGS)

RACE_TOOLGC := -toolexec='env GOGC=800'

SOAK_TIME    ?= 10m
SOAK_TIMEOUT ?= 2h

## soak: kvx serve with its plugins as processes under mixed load while they are killed
## and stopped at random, for SOAK_TIME (default 10m; make test runs the same test for 40 s):
## nothing leaked, every request answered, memory and p99 latency steady
soak: build
	$(TESTBIN_ENV) $(GO) test -vet=off -count=1 -timeout $(SOAK_TIMEOUT) -run '^TestServeSoak$$' -v ./cmd/kvx/soaktest -args -soak=$(SOAK_TIME)

## bench-smoke: every benchmark once, so a broken benchmark fails CI (.ci/run runs it
## after make test; the managers' benchmarks check the runs' invariants too)
bench-smoke: build
	$(TESTBIN_ENV) $(GO) test -vet=off -ldflags=-w -run '^$$' -bench . -benchtime 1x -timeout 15m ./...

## demo: side-by-side comparison of the cache managers on the bundled scenario (sim device)
demo: build
	$(BIN)/kvx compare --config scenarios/demo.yaml --vary cache_manager=v1,v2

## bench: manager bookkeeping, transport, sim worker, scheduler, engine replay, the
## managers' CPU time against v1's on every bundled sim scenario (v2/v1 and mamba/v1,
## in-process and as plugins; DESIGN §8: at most 1.25), and the plugin-isolation ratio
## (the same run in-process and as plugins, side by side)
bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./cachemgr_v1/ ./cachemgr_v2/ ./core/sched/ ./device/ ./plugins/v1/pluginrpc/ ./core/host/
	$(GO) test -run '^$$' -bench Replay -benchtime 2x ./core/engine/
	$(TESTBIN_ENV) $(GO) test -run '^$$' -bench ManagersOnScenario -benchtime 3x ./core/engine/
	$(BIN)/kvx compare -c cmd/kvx/testdata/small.yaml --set workload.requests=300 --vary isolation=inprocess,plugin

clean:
	rm -rf $(BIN)

include mk/proto.mk
include mk/examples.mk
include mk/cuda.mk
include mk/fuzz.mk
