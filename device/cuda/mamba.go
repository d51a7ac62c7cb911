//go:build cuda && cgo

package cuda

// Placeholder: the Mamba2 kernel and its state handling are being written
// (mamba.go, kernels/mamba.cu).

import (
	"context"
	"errors"

	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// seqState is what the device remembers of a sequence with Mamba layers.
type seqState struct{}

func (d *Device) prepareStates(o *ops, items []worker.Item) error {
	return errors.New("cuda: Mamba2 not built")
}

func (d *Device) finishStates(o *ops, items []worker.Item) {}

func (o *ops) Mamba2(ctx context.Context, layer int, segs []synth.Seg, in synth.Mamba2In, w synth.Mamba2Weights) (synth.Tensor, error) {
	return nil, errors.New("cuda: Mamba2 not built")
}
