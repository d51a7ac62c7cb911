package cpu

import (
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/hf"
)

// checkpointMamba sets the Mamba2 kernels of mix to a checkpoint's numerics
// (hf.Stage.Mamba2Numerics: Nemotron-H's gated-norm epsilon and dt floor),
// which the synthetic model's defaults (synth.NormEps, no floor) do not
// match. The paged device applies the floor to prompt tokens only
// (seqState.promptEnd), as transformers' prefill and decode paths do.
func checkpointMamba(mix map[int]*layerKernel, hs *hf.Stage) {
	eps, dtMin, ok := hs.Mamba2Numerics()
	if !ok {
		return
	}
	for _, x := range mix {
		if x.kind == device.KernelMamba2 {
			x.mamba.Eps, x.mamba.DtMin = eps, dtMin
		}
	}
}
