#!/usr/bin/env bash
# ptx-sm90a.sh [NVCC]: compile device/cuda/sm90a/*.cu (wgmma kernels, which
# only nvcc 12 or later can target: sm_90a) to device/cuda/ptx/sm90a/*.ptx,
# and record what they were made from in ptx/sm90a/SOURCES (TestPTXFresh
# checks it). make ptx-sm90a runs it; so does a GPU machine's nvcc, where
# this machine's nvcc 11.8 cannot (run it from the repository root).
set -euo pipefail
nvcc=${1:-${NVCC90:-/usr/local/cuda/bin/nvcc}}
command -v "$nvcc" >/dev/null 2>&1 || { echo "ptx-sm90a: no nvcc at $nvcc (give one of CUDA 12 or later: NVCC90=...)" >&2; exit 1; }
release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
if [ -z "$release" ] || [ "$release" -lt 12 ]; then
	echo "ptx-sm90a: $nvcc is CUDA ${release:-?}; sm_90a (wgmma) needs 12 or later" >&2
	exit 1
fi
cd device/cuda
mkdir -p ptx/sm90a
for f in sm90a/*.cu; do
	n=$(basename "$f" .cu)
	echo "nvcc $f -> ptx/sm90a/$n.ptx"
	# -fmad=false as make ptx: every multiply and add rounded on its own.
	"$nvcc" -arch=sm_90a -ptx -fmad=false -Ikernels "$f" -o "ptx/sm90a/$n.ptx"
done
# SOURCES: "sha256  <file>" for the sm90a sources and the headers of
# kernels/ they may include, sorted by path.
{ find sm90a -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' \); find kernels -maxdepth 1 -type f -name '*.cuh'; } |
	LC_ALL=C sort | xargs -r sha256sum >ptx/sm90a/SOURCES.tmp
mv ptx/sm90a/SOURCES.tmp ptx/sm90a/SOURCES
echo "wrote device/cuda/ptx/sm90a/SOURCES ($(wc -l <ptx/sm90a/SOURCES) sources)"
