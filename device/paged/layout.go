package paged

import (
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// PagedAt is where one layer's paged buffer lives in a paged pool's block.
type PagedAt struct {
	Pool   int // index in the layout
	Offset int // byte offset of the layer-buffer region in a block
	Stride int // bytes per token row (the buffer's BytesPerToken)
}

// StateAt is where one layer's state buffers live in a state pool's block.
type StateAt struct {
	Conv, ConvLen int // conv state offset and bytes (convLen 0: no conv buffer)
	SSM, SSMLen   int
}

// Placement is where one cache layer's buffers live.
type Placement struct {
	Paged map[spec.Role]PagedAt // device-tier pools only
	Live  int                   // index of the device state pool holding the live state; -1 when none
	State map[int]StateAt       // by pool index: every state pool holding the layer (live and snapshot pools)
}

// Place checks every pool's BlockBytes against the in-block layout
// and returns, per layer index of the stage, where its buffers live.
//
// A paged pool's block holds, for each layer of Pool.Layers in order and
// each of its paged buffers in order, TokensPerBlock × BytesPerToken bytes;
// a state pool's block holds, for each layer in order, its state buffers
// (conv, then ssm) back to back.
func Place(layers []spec.Layer, pools []kvcache.Pool) (map[int]*Placement, error) {
	byIndex := make(map[int]*spec.Layer, len(layers))
	for i := range layers {
		byIndex[layers[i].Index] = &layers[i]
	}
	place := make(map[int]*Placement)
	get := func(i int) *Placement {
		p := place[i]
		if p == nil {
			p = &Placement{Paged: map[spec.Role]PagedAt{}, Live: -1, State: map[int]StateAt{}}
			place[i] = p
		}
		return p
	}
	for pi, p := range pools {
		if p.TokensPerBlock < 0 || p.Blocks < 0 || p.BlockBytes < 0 {
			return nil, fmt.Errorf("pool %d (%s): tokens per block %d, blocks %d, block bytes %d must be >= 0", p.ID, p.Name, p.TokensPerBlock, p.Blocks, p.BlockBytes)
		}
		var off int64
		for _, li := range p.Layers {
			l := byIndex[li]
			if l == nil {
				return nil, fmt.Errorf("pool %d (%s): layer %d is not one of this stage's layers", p.ID, p.Name, li)
			}
			pl := get(li)
			var st StateAt
			has := false
			for _, b := range l.Buffers {
				switch {
				case p.TokensPerBlock > 0 && b.Paged():
					if p.Tier != kvcache.TierHost {
						if _, dup := pl.Paged[b.Role]; dup {
							return nil, fmt.Errorf("pool %d (%s): layer %d buffer %s is already in another device pool", p.ID, p.Name, li, b.Role)
						}
						pl.Paged[b.Role] = PagedAt{Pool: pi, Offset: int(off), Stride: int(b.BytesPerToken)}
					}
					off += int64(p.TokensPerBlock) * b.BytesPerToken
				case p.TokensPerBlock == 0 && !b.Paged():
					switch b.Role {
					case spec.RoleConvState:
						st.Conv, st.ConvLen = int(off), int(b.BytesPerSeq)
					case spec.RoleSSMState:
						st.SSM, st.SSMLen = int(off), int(b.BytesPerSeq)
					default:
						return nil, fmt.Errorf("pool %d (%s): layer %d state buffer role %q: want conv or ssm", p.ID, p.Name, li, b.Role)
					}
					has = true
					off += b.BytesPerSeq
				}
			}
			if has {
				pl.State[pi] = st
				if p.Tier != kvcache.TierHost {
					if pl.Live >= 0 {
						return nil, fmt.Errorf("pool %d (%s): layer %d state is already in device pool %d", p.ID, p.Name, li, pools[pl.Live].ID)
					}
					pl.Live = pi
				}
			}
		}
		if off != p.BlockBytes {
			return nil, fmt.Errorf("pool %d (%s): block bytes %d, but its %d layers' buffers take %d (tokens per block %d): the layout does not match the model's buffers",
				p.ID, p.Name, p.BlockBytes, len(p.Layers), off, p.TokensPerBlock)
		}
	}
	for _, l := range layers {
		pl := place[l.Index]
		for _, b := range l.Buffers {
			switch {
			case b.Paged() && (pl == nil || !hasRole(pl, b.Role)):
				return nil, fmt.Errorf("layer %d buffer %s is in no device pool of the layout", l.Index, b.Role)
			case !b.Paged() && (pl == nil || pl.Live < 0):
				return nil, fmt.Errorf("layer %d state buffer %s is in no device state pool of the layout", l.Index, b.Role)
			}
		}
	}
	return place, nil
}

func hasRole(pl *Placement, r spec.Role) bool {
	_, ok := pl.Paged[r]
	return ok
}
