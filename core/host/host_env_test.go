package host

import (
	"slices"
	"testing"
)

// TestInheritedEnv: a plugin gets the GPU runtime's and Nsight Systems'
// variables, the library paths and TMPDIR of kvx's environment, and
// nothing else (not kvx's own KVX_* config keys, not HOME or PATH).
func TestInheritedEnv(t *testing.T) {
	got := inheritedEnv([]string{
		"CUDA_VISIBLE_DEVICES=1", "HOME=/root", "KVX_DEVICE=cuda", "NVIDIA_TF32_OVERRIDE=0", "PATH=/bin",
		"LD_PRELOAD=/opt/nsight/inject.so", "NCCL_DEBUG=INFO", "TMPDIR=/scratch", "CUDA_KVX_PROFILE=/tmp/p.txt",
		"LD_LIBRARY_PATH=/usr/local/cuda/lib64", "XCUDA_Y=1", "NSYS_PROFILING_SESSION_ID=7", "QUADD_INJECTION_CONFIG=/tmp/c",
	})
	want := []string{"CUDA_VISIBLE_DEVICES=1", "NVIDIA_TF32_OVERRIDE=0", "LD_PRELOAD=/opt/nsight/inject.so", "NCCL_DEBUG=INFO",
		"TMPDIR=/scratch", "CUDA_KVX_PROFILE=/tmp/p.txt", "LD_LIBRARY_PATH=/usr/local/cuda/lib64", "NSYS_PROFILING_SESSION_ID=7",
		"QUADD_INJECTION_CONFIG=/tmp/c"}
	if !slices.Equal(got, want) {
		t.Errorf("inheritedEnv = %q, want %q", got, want)
	}
}
