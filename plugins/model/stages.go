package model

import (
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// SplitStages splits m.Layers into pp pipeline stages and returns [first,
// last) per stage. Decoder layers are split as TensorRT-LLM does
// (torch.tensor_split): each stage gets decoder/pp layers and the first
// decoder%pp stages one more. The MTP layers go to the last stage. It fails
// when pp < 1 or pp exceeds the number of decoder layers.
func SplitStages(m spec.Model, pp int) ([][2]int, error) {
	decoder := len(m.Layers) - m.NumNextN
	if pp < 1 {
		return nil, fmt.Errorf("pipeline parallel size %d must be >= 1", pp)
	}
	if decoder < 1 || m.NumNextN < 0 {
		return nil, fmt.Errorf("model %q: %d layers with %d MTP layers leaves no decoder layer", m.Name, len(m.Layers), m.NumNextN)
	}
	if pp > decoder {
		return nil, fmt.Errorf("pipeline parallel size %d exceeds the %d decoder layers of model %q", pp, decoder, m.Name)
	}
	stages := make([][2]int, pp)
	first := 0
	for s := range pp {
		n := decoder / pp
		if s < decoder%pp {
			n++
		}
		stages[s] = [2]int{first, first + n}
		first += n
	}
	stages[pp-1][1] = len(m.Layers)
	return stages, nil
}
