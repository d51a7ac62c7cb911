# mk/examples.mk: the third-party plugin examples, each in its own Go module.
#
# Included by the top-level Makefile; paths are relative to the repository root.
#
#   make examples   for each example: build it into bin/, vet and test it in
#                   its module (go test -vet=all: every analyzer go vet
#                   runs), run the conformance suite on the binary, and
#                   replay a scenario with the built-in plugin it stands in for
#                   and the example side by side: it fails unless both give the
#                   same outputs digest.
#                     examples/fifo     kvx-fifo, a cache manager, against
#                                       cache_manager v1 on EXAMPLES_SCENARIO
#                     examples/gqalite  kvx-backend-gqalite, an attention
#                                       backend, against attention_backend gqa on
#                                       EXAMPLES_BACKEND_SCENARIO
#
# The examples' modules are not part of the root module (each has its own
# go.mod and requires kvx through a replace of ../..), so `go test ./...` at
# the root does not reach them; this target does.

EXAMPLES_SCENARIO         ?= scenarios/cpu-llama.yaml
EXAMPLES_BACKEND_SCENARIO ?= examples/gqalite/testdata/llama-sim.yaml
EXAMPLES_REPORT           := $(BIN)/examples-compare.json
EXAMPLES_BACKEND_REPORT   := $(BIN)/examples-backend-compare.json

# same-digest REPORT WHAT: fail unless the two variants of REPORT have one
# outputs digest.
define same-digest
	@set -- $$(sed -n 's/.*"digest": *"\([0-9a-f][0-9a-f]*\)".*/\1/p' $(1)); \
	if [ $$# -ne 2 ] || [ "$$1" != "$$2" ]; then \
	  echo "examples: outputs digests of $(2) differ or are missing: $$*" >&2; exit 1; \
	fi; \
	echo "examples: $(2): the same outputs (digest $$1)"
endef

.PHONY: examples examples-fifo examples-gqalite

## examples: build, vet, test and prove the example plugins (examples/fifo against cachemgr-v1, examples/gqalite against the gqa backend)
# One after the other, also under make -j (make test): the second module's
# vet then finds the facts of what the two share (the standard library,
# gRPC, kvx's plugin packages) in the build cache, where side by side both
# computed them (12 CPU-s more on a cold cache).
examples: build
	@$(MAKE) --no-print-directory -j1 examples-fifo examples-gqalite

examples-fifo: build
	cd examples/fifo && $(GO) build -trimpath -o $(BIN)/kvx-fifo .
	cd examples/fifo && $(GO) test -vet=all -count=1 ./...
	$(BIN)/kvx conformance $(BIN)/kvx-fifo
	$(BIN)/kvx compare -c $(EXAMPLES_SCENARIO) --vary cache_manager=v1,./bin/kvx-fifo --no-progress --json $(EXAMPLES_REPORT)
	$(call same-digest,$(EXAMPLES_REPORT),cache_manager v1 and kvx-fifo on $(EXAMPLES_SCENARIO))

# examples-gqalite also pins the example by its SHA-256, as a user would.
examples-gqalite: build
	cd examples/gqalite && $(GO) build -trimpath -o $(BIN)/kvx-backend-gqalite .
	cd examples/gqalite && $(GO) test -vet=all -count=1 ./...
	$(BIN)/kvx conformance $(BIN)/kvx-backend-gqalite
	$(BIN)/kvx compare -c $(EXAMPLES_BACKEND_SCENARIO) --vary attention_backend=gqa,./bin/kvx-backend-gqalite --no-progress --json $(EXAMPLES_BACKEND_REPORT)
	$(call same-digest,$(EXAMPLES_BACKEND_REPORT),attention_backend gqa and kvx-backend-gqalite on $(EXAMPLES_BACKEND_SCENARIO))
	$(BIN)/kvx run -c $(EXAMPLES_BACKEND_SCENARIO) --set attention_backend=./bin/kvx-backend-gqalite \
	  --set plugin_sha256.attention_backend=$$(sha256sum $(BIN)/kvx-backend-gqalite | cut -d' ' -f1) --no-progress > /dev/null
