package cuda

import (
	"sort"
	"strings"
)

// ptxKernels lists the kernels (.entry) of a PTX module, sorted, and the
// ones among them whose code waits for the grid before it (griddepcontrol.wait,
// kernels/pdl.cuh's pdl_wait): those may be launched as programmatic
// dependents of the kernel before them (gpu.launch), because they touch no
// memory that kernel writes or reads before the wait. A kernel without the
// wait is launched the ordinary way, after everything before it. The scan
// needs no GPU, so ptx_entries_test.go checks it on the committed PTX.
func ptxKernels(ptx string) (names []string, waits map[string]bool) {
	waits = map[string]bool{}
	cur := "" // the entry whose body the scan is in, or "" outside entries
	for _, line := range strings.Split(ptx, "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, ".visible .entry "); ok {
			cur = ""
			if i := strings.IndexByte(rest, '('); i > 0 {
				cur = rest[:i]
				names = append(names, cur)
			}
			continue
		}
		if strings.HasPrefix(line, ".func ") || strings.Contains(line, " .func ") {
			cur = "" // a device function's body: its wait is not the entry's
			continue
		}
		if cur != "" && strings.HasPrefix(line, "griddepcontrol.wait") {
			waits[cur] = true
		}
	}
	sort.Strings(names)
	return names, waits
}

// pdlEnv turns programmatic dependent launches off when it is "0" (for
// comparing step times with and without them; kvx passes CUDA_* variables
// on to its plugins).
const pdlEnv = "CUDA_KVX_PDL"
