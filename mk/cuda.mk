# cuda.mk — the cuda device: its build dependencies, its PTX, and the bundle
# that runs it on a GPU machine (see shared/CUDA.md for why it is built this
# way). None of this runs in CI, which has no GPU and no .cuda/; `make build`
# and `make test` need none of it.
#
#   make cuda-deps    CUDA 11.8's cuda.h and stub libcuda.so into .cuda/
#   make cuda-nvcc    the same, plus Debian's nvcc 11.8 into .cuda/nvcc/
#   make ptx          device/cuda/kernels/*.cu -> device/cuda/ptx/*.ptx, and ptx/SOURCES
#   make ptx-sm90a    device/cuda/sm90a/*.cu -> device/cuda/ptx/sm90a/*.ptx (wgmma:
#                     nvcc 12 or later, e.g. a GPU machine's; NVCC90=...)
#   make cuda-vet     go vet -tags cuda of device/cuda and the backend mains
#   make cuda-build   the cuda backends (-tags cuda) and kvx, the managers (no tag) into .gpu/bin/
#   make gpu-bundle   cuda-build, the cuda test binary and the test data, packed
#                     into .gpu/bundle.tar.xz beside .gpu/run.sh; on the GPU
#                     machine: bash .gpu/run.sh

CUDA_DIR   := $(CURDIR)/.cuda
GPU_DIR    := $(CURDIR)/.gpu
KERNELS    := device/cuda/kernels
PTX_DIR    := device/cuda/ptx
NVCC       ?= $(CUDA_DIR)/nvcc/usr/lib/nvidia-cuda-toolkit/bin/nvcc
# -O3 is nvcc's default for device code. -fmad=false keeps every multiply
# and add rounded on its own, as the cpu reference kernels do.
NVCC_FLAGS ?= -ccbin /usr/bin/gcc -allow-unsupported-compiler -arch=sm_90 -ptx -fmad=false
# What cgo needs to compile gorgonia.org/cu: 11.8's cuda.h and a libcuda.so
# to link against (the driver's libcuda.so.1 is used at run time).
CUDA_ENV   := CGO_ENABLED=1 CGO_CFLAGS="-I$(CUDA_DIR)/include -Wno-deprecated-declarations" CGO_LDFLAGS="-L$(CUDA_DIR)/lib"
# The bundle must travel to the GPU machine within 64 MiB: no symbol tables.
GPU_LDFLAGS ?= -s -w

# Every backend binary under cmd/ (cmd/builtin's registry names them); the
# other binaries are kvx and the managers.
CUDA_BACKENDS := $(sort $(notdir $(wildcard cmd/kvx-backend-*)))
# kvx and the managers never link gorgonia.org/cu (cu's init exits on a
# machine without a GPU); kvx uses cgo for NVML (core/gpumem).
HOST_BINS     := $(filter-out builtin $(CUDA_BACKENDS),$(sort $(notdir $(wildcard cmd/kvx*))))

.PHONY: cuda-deps cuda-nvcc ptx ptx-sm90a cuda-vet cuda-build gpu-bundle

## cuda-deps: CUDA 11.8's cuda.h and stub libcuda.so into .cuda/ (what cuda-vet and
## cuda-build need, and run first; a no-op once they are there)
cuda-deps:
	bash scripts/cuda-deps.sh $(CUDA_DIR)

## cuda-nvcc: cuda-deps plus Debian's nvcc 11.8 into .cuda/nvcc/ (what ptx needs)
cuda-nvcc:
	bash scripts/cuda-deps.sh --nvcc $(CUDA_DIR)

## ptx: compile every device/cuda/kernels/*.cu to device/cuda/ptx/<name>.ptx
## (NVCC=... for another nvcc) and record the sources' sha256 in ptx/SOURCES
ptx:
	@command -v "$(NVCC)" >/dev/null 2>&1 || { echo "ptx: no nvcc at $(NVCC); run make cuda-nvcc, or set NVCC=/path/to/nvcc"; exit 1; }
	@ls $(KERNELS)/*.cu >/dev/null 2>&1 || { echo "ptx: no $(KERNELS)/*.cu to compile"; exit 1; }
	@mkdir -p $(PTX_DIR)
	@set -e; nvcc=$$(realpath "$$(command -v "$(NVCC)")"); cd device/cuda; for f in kernels/*.cu; do \
	  n=$$(basename $$f .cu); echo "nvcc $$f -> ptx/$$n.ptx"; \
	  "$$nvcc" $(NVCC_FLAGS) -Ikernels $$f -o ptx/$$n.ptx; \
	done
	@# SOURCES: "sha256  kernels/<file>" for every .cu, .cuh and .h under
	@# kernels/, sorted by path; TestPTXFresh recomputes it.
	@cd device/cuda && find kernels -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) | LC_ALL=C sort | xargs -r sha256sum > ptx/SOURCES.tmp && mv ptx/SOURCES.tmp ptx/SOURCES
	@echo "wrote $(PTX_DIR)/SOURCES ($$(wc -l < $(PTX_DIR)/SOURCES) sources)"

## ptx-sm90a: compile device/cuda/sm90a/*.cu (wgmma, sm_90a only) to device/cuda/ptx/sm90a/,
## with an nvcc of CUDA 12 or later (NVCC90=..., default /usr/local/cuda/bin/nvcc): on a GPU
## machine, bash scripts/ptx-sm90a.sh, and bring device/cuda/ptx/sm90a back
ptx-sm90a:
	bash scripts/ptx-sm90a.sh $(NVCC90)

## cuda-vet: go vet -tags cuda of device/cuda and the backend mains
cuda-vet: cuda-deps
	$(CUDA_ENV) $(GO) vet -tags cuda ./device/cuda/... $(CUDA_BACKENDS:%=./cmd/%)

## cuda-build: the backends with the cuda device, and kvx and the managers, into .gpu/bin/
cuda-build: cuda-deps
	@mkdir -p $(GPU_DIR)/bin
	$(CUDA_ENV) $(GO) build -tags cuda -trimpath -ldflags='$(GPU_LDFLAGS)' -o $(GPU_DIR)/bin/ $(CUDA_BACKENDS:%=./cmd/%)
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags='$(GPU_LDFLAGS)' -o $(GPU_DIR)/bin/ $(HOST_BINS:%=./cmd/%)

## gpu-bundle: everything a GPU machine needs into .gpu/ (run.sh, bundle.tar.xz, scripts/);
## run it there with bash .gpu/run.sh (as a device call: carry [".gpu"])
gpu-bundle: cuda-build
	@mkdir -p $(GPU_DIR)/test
	$(CUDA_ENV) $(GO) test -c -tags cuda -trimpath -ldflags='$(GPU_LDFLAGS)' -o $(GPU_DIR)/test/cuda.test ./device/cuda
	@test -x $(GPU_DIR)/test/cuda.test || { echo "gpu-bundle: device/cuda has no tests; nothing at .gpu/test/cuda.test"; exit 1; }
	rm -rf $(GPU_DIR)/scenarios $(GPU_DIR)/hf $(GPU_DIR)/scripts $(GPU_DIR)/bundle.tar.xz
	cp -r scenarios $(GPU_DIR)/scenarios
	mkdir -p $(GPU_DIR)/hf && cp -r device/hf/testdata $(GPU_DIR)/hf/testdata
	$(GO) run ./device/hf/hftest/mtpckpt -testdata device/hf/testdata -out $(GPU_DIR)/hf/mtp
	mkdir -p $(GPU_DIR)/scripts && cp scripts/*.py scripts/*.cu scripts/goldens.sh scripts/golden-family.sh $(GPU_DIR)/scripts/
	@# One xz stream with a 64 MiB window: the binaries share most of
	@# their code, so they pack to about a fifth of their size.
	@echo "packing .gpu/bundle.tar.xz (about a minute)"
	cd $(GPU_DIR) && tar -cf - bin test scenarios hf | xz -9 -T2 > bundle.tar.xz.tmp && mv bundle.tar.xz.tmp bundle.tar.xz
	cd $(GPU_DIR) && rm -rf bin test scenarios hf
	install -m 755 scripts/gpu-run.sh $(GPU_DIR)/run.sh
	@echo "bundle: $$(du -sh $(GPU_DIR) | cut -f1) in .gpu/; run it there with: bash .gpu/run.sh"
