package cuda

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPTXEntriesUnique checks that no two embedded PTX modules define a
// kernel of the same name: the device looks kernels up by name across all
// modules and refuses to start on a duplicate. Like TestPTXFresh it needs no
// GPU and runs without the cuda tag, so CI catches the clash.
func TestPTXEntriesUnique(t *testing.T) {
	files, err := filepath.Glob("ptx/*.ptx")
	if err != nil {
		t.Fatal(err)
	}
	sm90a, err := filepath.Glob("ptx/sm90a/*.ptx") // loaded beside them on compute capability 9.0
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, sm90a...)
	if len(files) == 0 {
		t.Skip("no embedded PTX yet")
	}
	where := map[string]string{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(src), "\n") {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), ".visible .entry ")
			if !ok {
				continue
			}
			name, _, _ := strings.Cut(rest, "(")
			if prev, dup := where[name]; dup {
				t.Errorf("kernel %s is defined in %s and in %s", name, prev, f)
			}
			where[name] = f
		}
	}
}

// TestPTXDependentLaunch checks the kernels gpu.launch starts as
// programmatic dependents of the kernel before them (ptxKernels: those
// whose PTX has griddepcontrol.wait): none touches global memory before its
// first wait, except the direct matmuls' weight loads (ld.global.nc with
// L1::no_allocate, kernels/fgemm.cu's ldg_stream), which read weights no
// kernel of a step writes; and every kernel of a fast decode step is one of
// them. The text order of PTX is its program order up to branches; the
// waits are the kernels' first statements, so a load above one in the text
// is one the compiler moved or the source issued first.
func TestPTXDependentLaunch(t *testing.T) {
	files, err := filepath.Glob("ptx/*.ptx")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Skip("no embedded PTX yet")
	}
	access := regexp.MustCompile(`^(ld\.global|st\.global|cp\.async|atom\.|red\.|ld\.volatile|st\.volatile)`)
	all := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, waits := ptxKernels(string(src))
		for k := range waits {
			all[k] = true
		}
		cur, waited := "", false
		for _, line := range strings.Split(string(src), "\n") {
			line = strings.TrimSpace(line)
			if rest, ok := strings.CutPrefix(line, ".visible .entry "); ok {
				cur, _, _ = strings.Cut(rest, "(")
				waited = false
				continue
			}
			if !waits[cur] || waited {
				continue
			}
			if strings.HasPrefix(line, "griddepcontrol.wait") {
				waited = true
				continue
			}
			if access.MatchString(line) {
				weight := strings.HasPrefix(cur, "kvx_fgemm_gemv") && strings.HasPrefix(line, "ld.global.nc.L1::no_allocate")
				if !weight {
					t.Errorf("%s: %s touches memory before its griddepcontrol.wait: %s", f, cur, line)
				}
			}
		}
	}
	for _, k := range []string{"kvx_frmsnorm", "kvx_fgemm_gemv1c2k4u4", "kvx_fgemm_gemv1c2k8u4", "kvx_fgemm_skinny1c2k4b64s4",
		"kvx_fgemm_skinny2c4k2b64s4", "kvx_fgemm_split4c4n2b64s4", "kvx_fgemm_fold", "kvx_rope_apply", "kvx_attn_write", "kvx_rope_write", "kvx_rope_write_fold",
		"kvx_fa_split_d128", "kvx_fa_merge", "kvx_to_bf16", "kvx_add", "kvx_fswiglu", "kvx_fswiglu_fold", "kvx_frmsnorm_fold", "kvx_frmsnorm_fold8", "kvx_gather_bf16", "kvx_argmax_part",
		"kvx_argmax_final", "kvx_gather_rows", "kvx_fa_prefill_d128w4", "kvx_fgemm_wide256s3s"} {
		if !all[k] {
			t.Errorf("%s does not wait for the kernel before it (kernels/pdl.cuh): it is launched after it, not beside it", k)
		}
	}
}
