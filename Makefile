# kvx — build, test, demo, bench, proto.
GO      ?= go
BIN     := $(CURDIR)/bin
TOOLS   := $(BIN)/tools
export PATH := $(TOOLS):$(PATH)

.PHONY: all build test test-short demo bench proto tools vet clean

all: build

## build: kvx and every plugin binary into ./bin
build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ ./cmd/...

## tools: what the tests need beyond Go (protoc and its Go generators)
tools:
	@command -v protoc >/dev/null 2>&1 || { \
	  echo "installing protobuf-compiler (protoc) with apt-get"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler) >/dev/null || \
	  echo "warning: could not install protoc; the generated-code staleness test will be skipped"; }
	@$(MAKE) --no-print-directory proto-tools

## vet: go vet over everything
vet:
	$(GO) vet ./...

## test: vet and the whole test suite (sim and cpu devices; no GPU needed)
test: tools build vet
	$(GO) test -timeout 15m -count=1 ./...

## demo: side-by-side comparison of the cache managers on the bundled scenario (sim device)
demo: build
	$(BIN)/kvx compare --config scenarios/demo.yaml --vary cache_manager=v1,v2

## bench: manager bookkeeping, transport, sim worker, scheduler, engine replay, and the
## plugin-isolation ratio (the same run in-process and as plugins, side by side)
bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./cachemgr_v1/ ./cachemgr_v2/ ./core/sched/ ./device/ ./plugins/v1/pluginrpc/ ./core/host/
	$(GO) test -run '^$$' -bench Replay -benchtime 2x ./core/engine/
	$(BIN)/kvx compare -c cmd/kvx/testdata/small.yaml --set workload.requests=300 --vary isolation=inprocess,plugin

clean:
	rm -rf $(BIN)

include mk/proto.mk
