package cpu

import (
	"fmt"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// pool is one pool of the layout as the device owns it.
type pool struct {
	kvcache.Pool
	mem kernel.Pool // Blocks × BlockBytes bytes
}

// state reports whether the pool holds per-sequence state (TokensPerBlock 0).
func (p *pool) state() bool { return p.TokensPerBlock == 0 }

// pagedAt is where one layer's paged buffer lives in a paged pool's block.
type pagedAt struct {
	pool   int // index in the layout
	offset int // byte offset of the layer-buffer region in a block
	stride int // bytes per token row (the buffer's BytesPerToken)
}

// stateAt is where one layer's state buffers live in a state pool's block.
type stateAt struct {
	conv, convLen int // conv state offset and bytes (convLen 0: no conv buffer)
	ssm, ssmLen   int
}

// placement is where one cache layer's buffers live.
type placement struct {
	paged map[spec.Role]pagedAt // device-tier pools only
	live  int                   // index of the device state pool holding the live state; -1 when none
	state map[int]stateAt       // by pool index: every state pool holding the layer (live and snapshot pools)
}

// placeLayout checks every pool's BlockBytes against the in-block layout
// and returns, per layer index of the stage, where its buffers live.
//
// A paged pool's block holds, for each layer of Pool.Layers in order and
// each of its paged buffers in order, TokensPerBlock × BytesPerToken bytes;
// a state pool's block holds, for each layer in order, its state buffers
// (conv, then ssm) back to back.
func placeLayout(layers []spec.Layer, pools []kvcache.Pool) (map[int]*placement, error) {
	byIndex := make(map[int]*spec.Layer, len(layers))
	for i := range layers {
		byIndex[layers[i].Index] = &layers[i]
	}
	place := make(map[int]*placement)
	get := func(i int) *placement {
		p := place[i]
		if p == nil {
			p = &placement{paged: map[spec.Role]pagedAt{}, live: -1, state: map[int]stateAt{}}
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
			var st stateAt
			has := false
			for _, b := range l.Buffers {
				switch {
				case p.TokensPerBlock > 0 && b.Paged():
					if p.Tier != kvcache.TierHost {
						if _, dup := pl.paged[b.Role]; dup {
							return nil, fmt.Errorf("pool %d (%s): layer %d buffer %s is already in another device pool", p.ID, p.Name, li, b.Role)
						}
						pl.paged[b.Role] = pagedAt{pool: pi, offset: int(off), stride: int(b.BytesPerToken)}
					}
					off += int64(p.TokensPerBlock) * b.BytesPerToken
				case p.TokensPerBlock == 0 && !b.Paged():
					switch b.Role {
					case spec.RoleConvState:
						st.conv, st.convLen = int(off), int(b.BytesPerSeq)
					case spec.RoleSSMState:
						st.ssm, st.ssmLen = int(off), int(b.BytesPerSeq)
					default:
						return nil, fmt.Errorf("pool %d (%s): layer %d state buffer role %q: want conv or ssm", p.ID, p.Name, li, b.Role)
					}
					has = true
					off += b.BytesPerSeq
				}
			}
			if has {
				pl.state[pi] = st
				if p.Tier != kvcache.TierHost {
					if pl.live >= 0 {
						return nil, fmt.Errorf("pool %d (%s): layer %d state is already in device pool %d", p.ID, p.Name, li, pools[pl.live].ID)
					}
					pl.live = pi
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
			case !b.Paged() && (pl == nil || pl.live < 0):
				return nil, fmt.Errorf("layer %d state buffer %s is in no device state pool of the layout", l.Index, b.Role)
			}
		}
	}
	return place, nil
}

func hasRole(pl *placement, r spec.Role) bool {
	_, ok := pl.paged[r]
	return ok
}
