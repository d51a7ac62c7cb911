# mk/proto.mk: regenerate the plugin protocol's Go code.
#
# Included by the top-level Makefile; paths are relative to the repository root.
#
#   make proto         regenerate plugins/internal/kvxpb from plugins/proto
#   make proto-tools   only install the pinned generators
#
# protoc itself comes from the system (Debian: apt-get install -y
# protobuf-compiler; 3.21.12 is what the committed files were made with). The
# two Go generators are tools of the root module (go.mod's tool block), so
# go.mod pins their versions and they build against the module's own
# protobuf runtime: on a cold cache nothing is compiled for them that make
# build does not compile anyway (a `go install pkg@version` built a second,
# older protobuf for protoc-gen-go-grpc on every fresh clone). They go into
# bin/tools, one directory per version, so a stale or foreign protoc-gen-go on
# PATH is never used. The versions below must be go.mod's (the binary reports
# its version, and plugins/internal/kvxpb/stale_test.go, which runs the same
# protoc command line, refuses any other): keep them in sync.

PROTOC                     ?= protoc
PROTOC_GEN_GO_VERSION      ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.5.1
PROTO_TOOLS_DIR            ?= bin/tools

PROTO_ROOT  := plugins/proto
PROTO_FILES := $(PROTO_ROOT)/kvx/v1/kvx.proto
PROTO_OUT   := plugins/internal/kvxpb
GO_MODULE   := github.com/kvx-dev/kvx

PROTOC_GEN_GO      := $(PROTO_TOOLS_DIR)/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(PROTO_TOOLS_DIR)/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc

.PHONY: proto proto-tools

proto-tools: $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)

$(PROTOC_GEN_GO):
	$(GO) build -o $@ google.golang.org/protobuf/cmd/protoc-gen-go

$(PROTOC_GEN_GO_GRPC):
	$(GO) build -o $@ google.golang.org/grpc/cmd/protoc-gen-go-grpc

proto: $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	@command -v $(PROTOC) >/dev/null || { echo "proto: $(PROTOC) not found; install it (Debian: apt-get install -y protobuf-compiler)" >&2; exit 1; }
	rm -f $(PROTO_OUT)/*.pb.go
	$(PROTOC) -I $(PROTO_ROOT) \
		--plugin=protoc-gen-go=$(abspath $(PROTOC_GEN_GO)) \
		--plugin=protoc-gen-go-grpc=$(abspath $(PROTOC_GEN_GO_GRPC)) \
		--go_out=. --go_opt=module=$(GO_MODULE) \
		--go-grpc_out=. --go-grpc_opt=module=$(GO_MODULE) \
		$(PROTO_FILES)
