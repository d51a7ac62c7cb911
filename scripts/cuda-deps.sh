#!/usr/bin/env bash
# cuda-deps.sh [--nvcc] [DIR]: puts into DIR (git-ignored; default .cuda)
# what building the cuda device here needs, without installing CUDA or
# touching /etc/apt (see shared/CUDA.md):
#
#   DIR/include/cuda.h, DIR/lib/libcuda.so
#       CUDA 11.8's driver API header and stub library: gorgonia.org/cu
#       builds against 11.8's cuda.h, not 12's or 13's. This is all that
#       `make cuda-vet`, `make cuda-build` and `make gpu-bundle` need.
#   DIR/nvcc/  (only with --nvcc)
#       Debian's nvcc 11.8, to remake the PTX (`make ptx`):
#       DIR/nvcc/usr/lib/nvidia-cuda-toolkit/bin/nvcc with a nvcc.profile of
#       its own (the package's points at /etc), the headers nvcc's front end
#       includes in DIR/nvcc/usr/include and libdevice beside bin/. Only
#       `nvcc -ptx` is needed: the static libraries of nvidia-cuda-dev (about
#       2.8 GB) are left out.
#
# It downloads Debian bookworm non-free packages (nvidia-cuda-dev, about
# 770 MB; with --nvcc also nvidia-cuda-toolkit) from the system's own mirror
# with a private apt state in DIR/.apt, extracts the files above and deletes
# the packages and that state. Idempotent: what is already complete is not
# fetched again, and an interrupted run leaves no half-made DIR/nvcc.
set -euo pipefail

usage() { echo "usage: cuda-deps.sh [--nvcc] [DIR]   (DIR defaults to .cuda)" >&2; }
dir=.cuda
want_nvcc=0
for a in "$@"; do
	case $a in
	--nvcc) want_nvcc=1 ;;
	-h | --help) usage; exit 0 ;;
	-*) echo "cuda-deps.sh: unknown flag $a (known: --nvcc)" >&2; usage; exit 2 ;;
	*) dir=$a ;;
	esac
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd -P)
tk=$dir/nvcc/usr/lib/nvidia-cuda-toolkit

have_base() { [[ -s $dir/include/cuda.h && -s $dir/lib/libcuda.so ]]; }
have_nvcc() {
	[[ -x $tk/bin/nvcc && -x $tk/bin/cicc && -f $tk/bin/nvcc.profile && ! -L $tk/bin/nvcc.profile &&
		-d $tk/libdevice && -f $dir/nvcc/usr/include/cuda_runtime.h ]]
}

need_base=0 need_nvcc=0
have_base || need_base=1
[[ $want_nvcc == 1 ]] && ! have_nvcc && need_nvcc=1
if [[ $need_base == 0 && $need_nvcc == 0 ]]; then
	echo "cuda-deps: $dir already has cuda.h and the stub libcuda.so$([[ $want_nvcc == 1 ]] && echo ' and nvcc 11.8')"
	exit 0
fi
for t in apt-get dpkg-deb tar; do
	command -v "$t" >/dev/null || { echo "cuda-deps: $t not found; this script needs a Debian-like system" >&2; exit 1; }
done

# The system's own Debian mirror (the first URIs: that is not the security
# archive), else deb.debian.org.
mirror=
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
	mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
fi
mirror=${mirror:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
signed=
[[ -f $keyring ]] && signed="[signed-by=$keyring] "

apt=$dir/.apt
cleanup() { rm -rf "$apt" "$dir/nvcc.partial"; }
trap cleanup EXIT
rm -rf "$apt"
mkdir -p "$apt/lists/partial" "$apt/archives/partial"
echo "deb ${signed}$mirror bookworm non-free" >"$apt/sources.list"
opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$apt/lists" -o "Dir::Cache::Archives=$apt/archives" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)

echo "cuda-deps: package index of $mirror bookworm non-free"
apt-get "${opts[@]}" -qq update
pkgs=(nvidia-cuda-dev)
[[ $need_nvcc == 1 ]] && pkgs+=(nvidia-cuda-toolkit)
echo "cuda-deps: downloading ${pkgs[*]} (nvidia-cuda-dev is about 770 MB)"
(cd "$apt/archives" && apt-get "${opts[@]}" -qq download "${pkgs[@]}")
dev=$(ls "$apt"/archives/nvidia-cuda-dev_*.deb)

if [[ $need_base == 1 ]]; then
	echo "cuda-deps: extracting cuda.h and the stub libcuda.so into $dir"
	dpkg-deb --fsys-tarfile "$dev" | tar -x -C "$apt" ./usr/include/cuda.h ./usr/lib/x86_64-linux-gnu/stubs/libcuda.so
	mkdir -p "$dir/include" "$dir/lib"
	mv -f "$apt/usr/include/cuda.h" "$dir/include/cuda.h"
	mv -f "$apt/usr/lib/x86_64-linux-gnu/stubs/libcuda.so" "$dir/lib/libcuda.so"
fi

if [[ $need_nvcc == 1 ]]; then
	echo "cuda-deps: extracting nvcc 11.8 into $dir/nvcc"
	p=$dir/nvcc.partial
	rm -rf "$p"
	mkdir -p "$p"
	dpkg-deb -x "$(ls "$apt"/archives/nvidia-cuda-toolkit_*.deb)" "$p"
	dpkg-deb --fsys-tarfile "$dev" | tar -x -C "$p" --exclude='./usr/lib/x86_64-linux-gnu/*' --exclude='./usr/share/*'
	b=$p/usr/lib/nvidia-cuda-toolkit/bin
	[[ -x $b/nvcc ]] || { echo "cuda-deps: nvidia-cuda-toolkit has no usr/lib/nvidia-cuda-toolkit/bin/nvcc" >&2; exit 1; }
	# The package's nvcc.profile is a link to /etc/nvcc.profile, which
	# points at /usr; this one points at the extracted tree
	# (TOP = DIR/nvcc).
	rm -f "$b/nvcc.profile"
	cat >"$b/nvcc.profile" <<'EOF'
TOP = $(_HERE_)/../../../..
NVVMIR_LIBRARY_DIR = $(_HERE_)/../libdevice
PATH += $(_HERE_):
INCLUDES += "-I$(TOP)/usr/include" $(_SPACE_)
EOF
	rm -rf "$dir/nvcc"
	mv "$p" "$dir/nvcc"
	if ! have_nvcc; then
		echo "cuda-deps: $dir/nvcc is incomplete (want bin/nvcc, bin/cicc, libdevice/ and usr/include/cuda_runtime.h)" >&2
		exit 1
	fi
fi

echo "cuda-deps: deleted the downloaded packages; $dir has:"
echo "  $dir/include/cuda.h"
echo "  $dir/lib/libcuda.so"
if [[ $want_nvcc == 1 ]]; then
	echo "  $tk/bin/nvcc ($("$tk/bin/nvcc" --version | awk '/release/ {print $5, $6}'))"
fi
