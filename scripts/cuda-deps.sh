#!/usr/bin/env bash
# cuda-deps.sh DIR: puts into DIR (git-ignored, default .cuda) what building
# the cuda device here needs, without installing CUDA or touching /etc/apt:
#   DIR/include/cuda.h, DIR/lib/libcuda.so   CUDA 11.8's driver API header and
#                                            stub library (gorgonia.org/cu builds
#                                            against 11.8, see shared/CUDA.md);
#   DIR/nvcc/                                 Debian's nvcc 11.8 (only with
#                                            --nvcc), to regenerate the PTX.
# It downloads Debian bookworm non-free packages from the system's own mirror
# with a private apt state, extracts the few files it needs and deletes the
# packages. Idempotent: a file already there is not fetched again.
set -euo pipefail
dir=.cuda
want_nvcc=0
for a in "$@"; do
	case $a in
	--nvcc) want_nvcc=1 ;;
	-*) echo "cuda-deps.sh: unknown flag $a (known: --nvcc)" >&2; exit 2 ;;
	*) dir=$a ;;
	esac
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [[ -f $dir/include/cuda.h && -f $dir/lib/libcuda.so && ($want_nvcc == 0 || -x $dir/nvcc/bin/nvcc) ]]; then
	exit 0
fi
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}
apt=$dir/.apt
mkdir -p "$apt/lists/partial" "$apt/archives/partial"
echo "deb $mirror bookworm main contrib non-free" >"$apt/sources.list"
opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$apt/lists" -o "Dir::Cache::Archives=$apt/archives" -o Debug::NoLocking=1)
echo "cuda-deps: apt index of $mirror bookworm non-free" >&2
apt-get "${opts[@]}" -qq update
cd "$apt/archives"
if [[ ! -f $dir/include/cuda.h || ! -f $dir/lib/libcuda.so ]]; then
	echo "cuda-deps: nvidia-cuda-dev (about 770 MB) for cuda.h and the stub libcuda.so" >&2
	apt-get "${opts[@]}" -qq download nvidia-cuda-dev
	mkdir -p "$dir/include" "$dir/lib"
	dpkg-deb --fsys-tarfile nvidia-cuda-dev_*.deb | tar -x -C "$apt" ./usr/include/cuda.h ./usr/lib/x86_64-linux-gnu/stubs/libcuda.so
	mv "$apt/usr/include/cuda.h" "$dir/include/cuda.h"
	mv "$apt/usr/lib/x86_64-linux-gnu/stubs/libcuda.so" "$dir/lib/libcuda.so"
	if [[ $want_nvcc == 1 ]]; then
		mkdir -p "$dir/nvcc/include"
		# the device-side headers nvcc's front end includes
		dpkg-deb --fsys-tarfile nvidia-cuda-dev_*.deb | tar -x -C "$dir/nvcc/include" --strip-components=3 --wildcards './usr/include/*' || true
	fi
	rm -f nvidia-cuda-dev_*.deb
fi
if [[ $want_nvcc == 1 && ! -x $dir/nvcc/bin/nvcc ]]; then
	echo "cuda-deps: nvidia-cuda-toolkit (nvcc, cicc, libdevice)" >&2
	apt-get "${opts[@]}" -qq download nvidia-cuda-toolkit nvidia-cuda-dev
	for p in nvidia-cuda-toolkit nvidia-cuda-dev; do
		dpkg-deb -x ${p}_*.deb "$apt/x"
	done
	ls -R "$apt/x" | head -100 >&2
fi
