package host

import (
	"slices"
	"testing"
)

// TestInheritedEnv: a plugin gets the GPU runtime's variables, the library
// paths and TMPDIR of kvx's environment, and nothing else (not kvx's own
// KVX_* config keys, not HOME or PATH).
func TestInheritedEnv(t *testing.T) {
	got := inheritedEnv([]string{
		"CUDA_VISIBLE_DEVICES=1", "HOME=/root", "KVX_DEVICE=cuda", "NVIDIA_TF32_OVERRIDE=0", "PATH=/bin",
		"LD_PRELOAD=/opt/nsight/inject.so", "NCCL_DEBUG=INFO", "TMPDIR=/scratch", "CUDA_KVX_PROFILE=/tmp/p.txt",
		"LD_LIBRARY_PATH=/usr/local/cuda/lib64", "XCUDA_Y=1",
	})
	want := []string{"CUDA_VISIBLE_DEVICES=1", "NVIDIA_TF32_OVERRIDE=0", "LD_PRELOAD=/opt/nsight/inject.so", "NCCL_DEBUG=INFO",
		"TMPDIR=/scratch", "CUDA_KVX_PROFILE=/tmp/p.txt", "LD_LIBRARY_PATH=/usr/local/cuda/lib64"}
	if !slices.Equal(got, want) {
		t.Errorf("inheritedEnv = %q, want %q", got, want)
	}
}
