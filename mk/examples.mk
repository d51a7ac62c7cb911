# mk/examples.mk: the third-party plugin examples, each in its own Go module.
#
# Included by the top-level Makefile; paths are relative to the repository root.
#
#   make examples   build examples/fifo into bin/kvx-fifo, vet and test it in
#                   its module, run the conformance suite on the binary, and
#                   replay EXAMPLES_SCENARIO with cachemgr-v1 and kvx-fifo side
#                   by side: it fails unless both give the same outputs digest.
#
# The examples module is not part of the root module (it has its own go.mod
# and requires kvx through a replace of ../..), so `go test ./...` at the root
# does not reach it; this target does.

EXAMPLES_SCENARIO ?= scenarios/cpu-llama.yaml
EXAMPLES_REPORT   := $(BIN)/examples-compare.json

.PHONY: examples

## examples: build, vet, test and prove the example plugin (examples/fifo) against cachemgr-v1
examples: build
	cd examples/fifo && $(GO) build -trimpath -o $(BIN)/kvx-fifo .
	cd examples/fifo && $(GO) vet ./... && $(GO) test -count=1 ./...
	$(BIN)/kvx conformance $(BIN)/kvx-fifo
	$(BIN)/kvx compare -c $(EXAMPLES_SCENARIO) --vary cache_manager=v1,./bin/kvx-fifo --no-progress --json $(EXAMPLES_REPORT)
	@set -- $$(sed -n 's/.*"digest": *"\([0-9a-f][0-9a-f]*\)".*/\1/p' $(EXAMPLES_REPORT)); \
	if [ $$# -ne 2 ] || [ "$$1" != "$$2" ]; then \
	  echo "examples: outputs digests of v1 and kvx-fifo differ or are missing: $$*" >&2; exit 1; \
	fi; \
	echo "examples: kvx-fifo gives the outputs of cachemgr-v1 on $(EXAMPLES_SCENARIO) (digest $$1)"
