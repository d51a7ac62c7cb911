package cpu_test

import (
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// denseDSA is a backend the cpu device has never heard of: the DSA
// backend's mixers and costs, but DSA layers run by the dense MLA kernel.
type denseDSA struct{ device.Backend }

func (denseDSA) Name() string { return "dense-dsa" }

func (denseDSA) Kernel(m spec.Mixer) device.Kernel {
	if m == spec.MixerDSA {
		return device.KernelMLA
	}
	return device.KernelNone
}

func init() { backends["dense-dsa"] = denseDSA{dsa.Backend} }

// The device runs the kernel the backend names, whatever the backend is
// called: a new backend mapping DSA layers to dense MLA gives, bit for bit,
// the dense-MLA reference (the mla backend's choice), and not the sparse one.
func TestBackendChoosesKernel(t *testing.T) {
	skipUnderRace(t)
	m := synthModel(t, "deepseek-v3.2", model.SyntheticSpec{}, "bf16")
	dense, err := cpu.NewReference(m, seed, mla.Backend.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	sparse, err := cpu.NewReference(m, seed, dsa.Backend.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, m, opts{backend: "dense-dsa", manager: "v2"})
	reqs := requests(m.Vocab, [3]int{9, 23, 30}, 5)
	r.run(reqs)
	checkReference(t, dense, reqs)
	if msgs := mismatches(t, sparse, reqs); len(msgs) == 0 {
		t.Errorf("the sparse DSA reference gives the same tokens and logits (index_topk %d): the test cannot tell the kernels apart", m.IndexTopK)
	}
}
