//go:build cuda && cgo

package cuda

// Placeholder: the attention kernels are being written (attn.go, kernels/attn.cu).

import (
	"context"
	"errors"

	"github.com/kvx-dev/kvx/device/synth"
)

func (o *ops) GQA(ctx context.Context, layer int, segs []synth.Seg, q, k, v synth.Tensor) (synth.Tensor, error) {
	return nil, errors.New("cuda: GQA not built")
}

func (o *ops) MLA(ctx context.Context, layer int, segs []synth.Seg, in synth.MLAIn, w synth.MLAWeights) (synth.Tensor, error) {
	return nil, errors.New("cuda: MLA not built")
}

func (o *ops) DSA(ctx context.Context, layer int, segs []synth.Seg, in synth.MLAIn, ix synth.IndexIn, w synth.MLAWeights) (synth.Tensor, error) {
	return nil, errors.New("cuda: DSA not built")
}
