package model

import (
	"fmt"
	"io"
	"os"
)

// Limits on what a config.json may state. Parse checks every size against
// them before it uses any (before a layer is appended or a product taken),
// so that a hostile or corrupt config.json is an error naming the field,
// its value and the limit instead of an allocation that takes the machine's
// memory. They are far above every real model (the largest in
// SOURCES.md: 118 layers, hidden 8192, vocabulary 154880, 1M positions,
// 512 experts, head dims 256): raise one when a real model needs it.
const (
	// MaxConfigBytes bounds the config.json file itself (real ones are
	// a few KiB); JSON decoding allocates in proportion to it.
	MaxConfigBytes = 16 << 20
	// MaxLayers bounds the layers of a model, decoder and MTP layers
	// together, and every per-layer list (layer_types, the hybrid
	// pattern, ...).
	MaxLayers = 4096
	// MaxHidden bounds hidden_size and every intermediate (FFN) size.
	MaxHidden = 1 << 20
	// MaxVocab bounds vocab_size.
	MaxVocab = 1 << 24
	// MaxPositions bounds max_position_embeddings, sliding_window and
	// index_topk.
	MaxPositions = 1 << 30
	// MaxHeads bounds every head count, group count, expert count and
	// LoRA rank.
	MaxHeads = 1 << 16
	// MaxHeadDim bounds every head dimension and state size.
	MaxHeadDim = 1 << 16
	// MaxWidth bounds the products of a head count and a head dimension
	// (the width of a projection or of a per-token cache row).
	MaxWidth = 1 << 24
	// maxSmall bounds small counts: conv kernels, expand factors.
	maxSmall = 1 << 10
)

// readConfigFile reads a config.json of at most MaxConfigBytes.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("%s: larger than the %d-byte limit for a config.json (MaxConfigBytes)", path, MaxConfigBytes)
	}
	return data, nil
}

// bound is one size a config.json states and its limit.
type bound struct {
	field string
	v     int
	limit int
}

func ptr(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// bounds checks every size of c against its limit (and against 0 from
// below) before the parser uses any, and the products the parser and
// FillBuffers take. It reports each violation; true when there is none.
func (p *parser) bounds() bool {
	c := p.c
	n0 := len(p.errs)
	for _, b := range []bound{
		{"hidden_size", c.Hidden, MaxHidden},
		{"vocab_size", c.Vocab, MaxVocab},
		{"max_position_embeddings", c.MaxPosition, MaxPositions},
		{"num_hidden_layers", ptr(c.NumLayers), MaxLayers},
		{"num_attention_heads", c.Heads, MaxHeads},
		{"num_key_value_heads", ptr(c.KVHeads), MaxHeads},
		{"head_dim", ptr(c.HeadDim), MaxHeadDim},
		{"attention_head_dim", ptr(c.AttentionHeadDim), MaxHeadDim},
		{"sliding_window", max(ptr(c.SlidingWindow), 0), MaxPositions}, // <= 0: no window
		{"q_lora_rank", ptr(c.QLoraRank), MaxHeads},
		{"kv_lora_rank", c.KVLoraRank, MaxHeads},
		{"qk_nope_head_dim", c.QKNopeHeadDim, MaxHeadDim},
		{"qk_rope_head_dim", c.QKRopeHeadDim, MaxHeadDim},
		{"v_head_dim", c.VHeadDim, MaxHeadDim},
		{"index_n_heads", c.IndexHeads, MaxHeads},
		{"index_head_dim", c.IndexHeadDim, MaxHeadDim},
		{"index_topk", c.IndexTopK, MaxPositions},
		{"indexer_types entries", len(c.IndexerTypes), MaxLayers},
		{"intermediate_size", c.Intermediate, MaxHidden},
		{"moe_intermediate_size", c.MoEIntermediate, MaxHidden},
		{"n_routed_experts", ptr(c.RoutedExperts), MaxHeads},
		{"num_experts", c.NumExperts, MaxHeads},
		{"num_experts_per_tok", c.ExpertsPerToken, MaxHeads},
		{"n_shared_experts", c.SharedExperts, MaxHeads},
		{"moe_shared_expert_intermediate_size", c.SharedIntermediate, MaxHidden},
		{"shared_expert_intermediate_size", c.QwenSharedInter, MaxHidden},
		{"moe_latent_size", ptr(c.MoELatent), MaxHidden},
		{"first_k_dense_replace", c.FirstKDense, MaxLayers},
		{"moe_layer_freq", c.MoELayerFreq, MaxLayers},
		{"mlp_layer_types entries", len(c.MLPLayerTypes), MaxLayers},
		{"decoder_sparse_step", c.DecoderSparseStep, MaxLayers},
		{"mlp_only_layers entries", len(c.MLPOnlyLayers), MaxLayers},
		{"num_nextn_predict_layers", c.NumNextNPredictLayers, MaxLayers},
		{"layer_types entries", len(c.LayerTypes), MaxLayers},
		{"hybrid_override_pattern length", len(c.HybridPattern), MaxLayers},
		{"layers_block_type entries", len(c.LayersBlockType), MaxLayers},
		{"mtp_hybrid_override_pattern length", len(c.MTPHybridPattern), MaxLayers},
		{"mtp_layers_block_type entries", len(c.MTPBlockType), MaxLayers},
		{"mamba_num_heads", c.MambaHeads, MaxHeads},
		{"mamba_head_dim", c.MambaHeadDim, MaxHeadDim},
		{"ssm_state_size", c.SSMStateSize, MaxHeadDim},
		{"n_groups", c.NGroups, MaxHeads},
		{"conv_kernel", c.ConvKernel, maxSmall},
		{"expand", c.Expand, maxSmall},
		{"full_attention_interval", c.FullAttentionInterval, MaxLayers},
		{"linear_conv_kernel_dim", c.LinearConvKernel, maxSmall},
		{"linear_key_head_dim", c.LinearKeyHeadDim, MaxHeadDim},
		{"linear_num_key_heads", c.LinearNumKeyHeads, MaxHeads},
		{"linear_num_value_heads", c.LinearNumValueHeads, MaxHeads},
		{"linear_value_head_dim", c.LinearValueHeadDim, MaxHeadDim},
	} {
		switch {
		case b.v < 0:
			p.errorf("config field %s is %d, want >= 0", b.field, b.v)
		case b.v > b.limit:
			p.errorf("config field %s is %d, above the limit %d", b.field, b.v, b.limit)
		}
	}
	if len(p.errs) > n0 {
		return false // the products below assume the factors in range
	}
	// Each factor is at most 2^30, so each product fits an int64.
	for _, w := range []struct {
		fields string
		v      int
	}{
		{"num_attention_heads × head_dim", c.Heads * max(ptr(c.HeadDim), ptr(c.AttentionHeadDim), c.QKNopeHeadDim+c.QKRopeHeadDim, c.VHeadDim)},
		{"num_key_value_heads × head_dim", ptr(c.KVHeads) * max(ptr(c.HeadDim), ptr(c.AttentionHeadDim))},
		{"kv_lora_rank + qk_rope_head_dim", c.KVLoraRank + c.QKRopeHeadDim},
		{"index_n_heads × index_head_dim", c.IndexHeads * c.IndexHeadDim},
		{"mamba_num_heads × mamba_head_dim", c.MambaHeads * c.MambaHeadDim},
		{"expand × hidden_size", c.Expand * c.Hidden},
		{"n_groups × ssm_state_size", c.NGroups * c.SSMStateSize},
		{"linear_num_value_heads × linear_value_head_dim", c.LinearNumValueHeads * c.LinearValueHeadDim},
		{"linear_num_key_heads × linear_key_head_dim", c.LinearNumKeyHeads * c.LinearKeyHeadDim},
	} {
		if w.v > MaxWidth {
			p.errorf("config fields %s are %d, above the limit %d (MaxWidth)", w.fields, w.v, MaxWidth)
		}
	}
	return len(p.errs) == n0
}

// layerRoom reports an error and returns false when adding extra layers to
// the have already there would take the model past MaxLayers.
func (p *parser) layerRoom(have, extra int, what string) bool {
	if have+extra > MaxLayers {
		p.errorf("config gives %d layers (%d plus %s %d), above the limit %d (MaxLayers)", have+extra, have, what, extra, MaxLayers)
		return false
	}
	return true
}
