package model

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// SyntheticSpec holds the overrides of a synthetic model (config key
// synthetic.<snake_case field>). Zero means "a small default derived from the
// base model"; see Synthetic for the defaults and the limits.
type SyntheticSpec struct {
	Layers          int // decoder layers kept from the base pattern (MTP layers come on top)
	MTPLayers       int // MTP layers; 0 = as many as the base has
	Hidden          int
	Heads           int
	KVHeads         int
	HeadDim         int
	Vocab           int
	Intermediate    int
	MoEIntermediate int
	Experts         int
	ExpertsPerToken int
	MoELatent       int // latent MoE projection size (Nemotron-3 Super/Ultra)
	Window          int // sliding window of the base's windowed layers
	QLoraRank       int
	KVLoraRank      int
	QKNopeHeadDim   int
	QKRopeHeadDim   int
	VHeadDim        int
	IndexHeads      int
	IndexHeadDim    int
	IndexTopK       int
	MambaHeads      int
	MambaHeadDim    int
	SSMStateSize    int
	NGroups         int
	ConvKernel      int
	MaxPosition     int
}

// SyntheticField is one field of SyntheticSpec with its config key.
type SyntheticField struct {
	Key string // snake_case, as under the config's synthetic: block
	Ptr func(*SyntheticSpec) *int
}

// SyntheticFields lists every field of SyntheticSpec with its snake_case key,
// in declaration order. The config package builds its synthetic.* keys from it.
func SyntheticFields() []SyntheticField {
	return []SyntheticField{
		{"layers", func(s *SyntheticSpec) *int { return &s.Layers }},
		{"mtp_layers", func(s *SyntheticSpec) *int { return &s.MTPLayers }},
		{"hidden", func(s *SyntheticSpec) *int { return &s.Hidden }},
		{"heads", func(s *SyntheticSpec) *int { return &s.Heads }},
		{"kv_heads", func(s *SyntheticSpec) *int { return &s.KVHeads }},
		{"head_dim", func(s *SyntheticSpec) *int { return &s.HeadDim }},
		{"vocab", func(s *SyntheticSpec) *int { return &s.Vocab }},
		{"intermediate", func(s *SyntheticSpec) *int { return &s.Intermediate }},
		{"moe_intermediate", func(s *SyntheticSpec) *int { return &s.MoEIntermediate }},
		{"experts", func(s *SyntheticSpec) *int { return &s.Experts }},
		{"experts_per_token", func(s *SyntheticSpec) *int { return &s.ExpertsPerToken }},
		{"moe_latent", func(s *SyntheticSpec) *int { return &s.MoELatent }},
		{"window", func(s *SyntheticSpec) *int { return &s.Window }},
		{"q_lora_rank", func(s *SyntheticSpec) *int { return &s.QLoraRank }},
		{"kv_lora_rank", func(s *SyntheticSpec) *int { return &s.KVLoraRank }},
		{"qk_nope_head_dim", func(s *SyntheticSpec) *int { return &s.QKNopeHeadDim }},
		{"qk_rope_head_dim", func(s *SyntheticSpec) *int { return &s.QKRopeHeadDim }},
		{"v_head_dim", func(s *SyntheticSpec) *int { return &s.VHeadDim }},
		{"index_heads", func(s *SyntheticSpec) *int { return &s.IndexHeads }},
		{"index_head_dim", func(s *SyntheticSpec) *int { return &s.IndexHeadDim }},
		{"index_topk", func(s *SyntheticSpec) *int { return &s.IndexTopK }},
		{"mamba_heads", func(s *SyntheticSpec) *int { return &s.MambaHeads }},
		{"mamba_head_dim", func(s *SyntheticSpec) *int { return &s.MambaHeadDim }},
		{"ssm_state_size", func(s *SyntheticSpec) *int { return &s.SSMStateSize }},
		{"n_groups", func(s *SyntheticSpec) *int { return &s.NGroups }},
		{"conv_kernel", func(s *SyntheticSpec) *int { return &s.ConvKernel }},
		{"max_position", func(s *SyntheticSpec) *int { return &s.MaxPosition }},
	}
}

// Limits of synthetic models.
const (
	// SyntheticMinVocab is 256 byte tokens plus BOS and EOS.
	SyntheticMinVocab = 258
	syntheticMaxDim   = 1 << 14 // any width or head count
	syntheticMaxVocab = 1 << 20
	syntheticMaxPos   = 1 << 24
)

// Synthetic defaults (before the limits of the base are applied).
const (
	synthHidden      = 64
	synthHeads       = 4
	synthHeadDim     = 16
	synthLayers      = 4
	synthMaxPosition = 4096
	synthWindow      = 32
	synthExperts     = 8
	synthTopK        = 2
	synthKVLora      = 32
	synthQLora       = 32
	synthNope        = 16
	synthRope        = 8
	synthVHead       = 16
	synthIndexHeads  = 2
	synthIndexDim    = 16
	synthIndexTopK   = 16
	synthMambaHeads  = 4
	synthMambaDim    = 16
	synthSSMState    = 16
	synthNGroups     = 2
	synthConvKernel  = 4
)

// layerKind is what a representative subsequence must keep.
type layerKind struct {
	mixer    spec.Mixer
	ffn      spec.FFN
	windowed bool
}

func kindOf(l spec.Layer) layerKind { return layerKind{l.Mixer, l.FFN, l.Window > 0} }

// Synthetic returns a scaled-down copy of base for the cpu device: the same
// architecture (Arch is kept, so a worker still tells Mamba2 from GDN and
// SwiGLU from relu2) and the same kinds of layers, with small dimensions.
//
// Layers: Layers decoder layers are taken from the base's decoder layers as a
// representative subsequence, in base order: the first layer of every kind
// (mixer, FFN, windowed or not) is always kept, the rest are spread evenly
// over the base. Default min(4, base) but at least the number of kinds; it
// must not exceed the base's decoder layers. Then MTPLayers copies of the
// base's MTP layer (default: the base's count; only for a base with MTP).
//
// Defaults (0 = default): hidden 64; heads 4; kv_heads heads divided by the
// base's query-per-KV ratio (at least 1, dividing heads); head_dim 16 (GQA;
// MLA head_dim is qk_nope + qk_rope); vocab 258 (256 bytes, BOS, EOS);
// intermediate 2*hidden; moe_intermediate hidden/2; experts min(8, base);
// experts_per_token min(2, base, experts); shared experts min(1, base) with
// the width of one routed expert; window min(32, base window); q_lora_rank 32
// when the base has one; kv_lora_rank 32; qk_nope 16; qk_rope 8; v_head_dim
// 16; index heads 2, head_dim 16, topk 16; mamba heads 4, head_dim 16,
// ssm_state_size 16, n_groups min(2, base), conv_kernel min(4, base);
// moe_latent hidden/2 when the base has a latent MoE (else it stays 0);
// max_position min(4096, base). Derived defaults are capped at the limits.
//
// Errors name the field as the config key (synthetic.<key>), the value and
// the limit; an override of a part the base lacks (mamba_heads on Llama) is
// an error too. All problems are reported, joined. Buffers are cleared: call
// FillBuffers, exactly as for a loaded model. Safe for concurrent use; the
// result owns its slices.
func Synthetic(base spec.Model, s SyntheticSpec) (spec.Model, error) {
	var errs []error
	bad := func(key string, v int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("synthetic.%s: %d "+format, append([]any{key, v}, args...)...))
	}
	for _, f := range SyntheticFields() {
		if v := *f.Ptr(&s); v < 0 {
			bad(f.Key, v, "must be >= 0 (0 = default)")
		}
	}
	if len(errs) > 0 {
		return spec.Model{}, errors.Join(errs...)
	}

	decoder := base.Layers[:len(base.Layers)-base.NumNextN]
	mtp := base.Layers[len(base.Layers)-base.NumNextN:]
	var gqa, mla, dsa, mamba, dense, moe, windowed bool
	baseWindow := 0
	var kinds []layerKind
	for _, l := range base.Layers {
		switch l.Mixer {
		case spec.MixerGQA:
			gqa = true
		case spec.MixerMLA:
			mla = true
		case spec.MixerDSA:
			dsa = true
		case spec.MixerMamba:
			mamba = true
		}
		switch l.FFN {
		case spec.FFNDense:
			dense = true
		case spec.FFNMoE:
			moe = true
		}
		if l.Window > 0 {
			windowed = true
			baseWindow = max(baseWindow, l.Window)
		}
	}
	for _, l := range decoder {
		if k := kindOf(l); !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	mlaLike := mla || dsa

	// pick returns the override or the default; limit checks follow.
	pick := func(v, def int) int {
		if v > 0 {
			return v
		}
		return def
	}
	// unused reports an override of a part the base lacks.
	unused := func(key string, v int, has bool, what string) {
		if v > 0 && !has {
			bad(key, v, "is set but model %q has no %s", base.Name, what)
		}
	}
	unused("window", s.Window, windowed, "sliding-window layers")
	unused("kv_heads", s.KVHeads, gqa, "GQA layers (MLA uses one KV head per query head)")
	unused("head_dim", s.HeadDim, gqa, "GQA layers (the MLA head_dim is qk_nope_head_dim + qk_rope_head_dim)")
	for _, f := range []struct {
		key string
		v   int
	}{{"q_lora_rank", s.QLoraRank}, {"kv_lora_rank", s.KVLoraRank}, {"qk_nope_head_dim", s.QKNopeHeadDim},
		{"qk_rope_head_dim", s.QKRopeHeadDim}, {"v_head_dim", s.VHeadDim}} {
		unused(f.key, f.v, mlaLike, "MLA or DSA layers")
	}
	unused("q_lora_rank", s.QLoraRank, !mlaLike || base.QLoraRank > 0, "query LoRA (q_lora_rank)")
	for _, f := range []struct {
		key string
		v   int
	}{{"index_heads", s.IndexHeads}, {"index_head_dim", s.IndexHeadDim}, {"index_topk", s.IndexTopK}} {
		unused(f.key, f.v, dsa, "DSA layers")
	}
	for _, f := range []struct {
		key string
		v   int
	}{{"mamba_heads", s.MambaHeads}, {"mamba_head_dim", s.MambaHeadDim}, {"ssm_state_size", s.SSMStateSize},
		{"n_groups", s.NGroups}, {"conv_kernel", s.ConvKernel}} {
		unused(f.key, f.v, mamba, "Mamba layers")
	}
	for _, f := range []struct {
		key string
		v   int
	}{{"moe_intermediate", s.MoEIntermediate}, {"experts", s.Experts}, {"experts_per_token", s.ExpertsPerToken}} {
		unused(f.key, f.v, moe, "MoE layers")
	}
	unused("intermediate", s.Intermediate, dense, "dense MLP layers")
	unused("moe_latent", s.MoELatent, base.MoELatent > 0, "latent MoE projection (moe_latent)")
	unused("mtp_layers", s.MTPLayers, len(mtp) > 0, "MTP layers")

	m := spec.Model{
		Name:        base.Name + "-synthetic",
		Arch:        base.Arch,
		Hidden:      pick(s.Hidden, synthHidden),
		Vocab:       pick(s.Vocab, SyntheticMinVocab),
		MaxPosition: pick(s.MaxPosition, min(synthMaxPosition, max(base.MaxPosition, 1))),
	}
	dim := func(key string, v int) {
		if v > syntheticMaxDim {
			bad(key, v, "exceeds the synthetic limit %d", syntheticMaxDim)
		}
	}
	dim("hidden", m.Hidden)
	if m.Vocab < SyntheticMinVocab || m.Vocab > syntheticMaxVocab {
		bad("vocab", m.Vocab, "is out of range; allowed: %d (256 bytes + BOS + EOS) <= vocab <= %d", SyntheticMinVocab, syntheticMaxVocab)
	}
	if m.MaxPosition > syntheticMaxPos {
		bad("max_position", m.MaxPosition, "exceeds the synthetic limit %d", syntheticMaxPos)
	}

	// Attention.
	if gqa || mlaLike {
		m.Heads = pick(s.Heads, synthHeads)
		dim("heads", m.Heads)
	} else if s.Heads > 0 {
		bad("heads", s.Heads, "is set but model %q has no attention layers", base.Name)
	}
	if gqa {
		ratio := 1
		if base.KVHeads > 0 && base.Heads >= base.KVHeads {
			ratio = base.Heads / base.KVHeads
		}
		kv := max(1, m.Heads/ratio)
		for m.Heads%kv != 0 {
			kv--
		}
		m.KVHeads = pick(s.KVHeads, kv)
		m.HeadDim = pick(s.HeadDim, synthHeadDim)
		switch {
		case m.KVHeads > m.Heads:
			bad("kv_heads", m.KVHeads, "exceeds synthetic.heads %d", m.Heads)
		case m.Heads%m.KVHeads != 0:
			bad("heads", m.Heads, "is not a multiple of synthetic.kv_heads %d", m.KVHeads)
		}
		if m.HeadDim%2 != 0 {
			bad("head_dim", m.HeadDim, "must be even (rotary embedding pairs)")
		}
		dim("head_dim", m.HeadDim)
	}
	if mlaLike {
		m.KVHeads = m.Heads
		if base.QLoraRank > 0 {
			m.QLoraRank = pick(s.QLoraRank, synthQLora)
		}
		m.KVLoraRank = pick(s.KVLoraRank, synthKVLora)
		m.QKNopeHeadDim = pick(s.QKNopeHeadDim, synthNope)
		m.QKRopeHeadDim = pick(s.QKRopeHeadDim, synthRope)
		m.VHeadDim = pick(s.VHeadDim, synthVHead)
		m.HeadDim = m.QKNopeHeadDim + m.QKRopeHeadDim
		if m.QKRopeHeadDim%2 != 0 {
			bad("qk_rope_head_dim", m.QKRopeHeadDim, "must be even (rotary embedding pairs)")
		}
		for _, f := range []struct {
			key string
			v   int
		}{{"q_lora_rank", m.QLoraRank}, {"kv_lora_rank", m.KVLoraRank}, {"qk_nope_head_dim", m.QKNopeHeadDim},
			{"qk_rope_head_dim", m.QKRopeHeadDim}, {"v_head_dim", m.VHeadDim}} {
			dim(f.key, f.v)
		}
	}
	if dsa {
		m.IndexHeads = pick(s.IndexHeads, synthIndexHeads)
		m.IndexHeadDim = pick(s.IndexHeadDim, synthIndexDim)
		m.IndexTopK = pick(s.IndexTopK, synthIndexTopK)
		dim("index_heads", m.IndexHeads)
		dim("index_head_dim", m.IndexHeadDim)
		if m.IndexTopK > m.MaxPosition {
			bad("index_topk", m.IndexTopK, "exceeds synthetic.max_position %d", m.MaxPosition)
		}
		if base.QKRopeHeadDim > 0 && m.IndexHeadDim < m.QKRopeHeadDim {
			bad("index_head_dim", m.IndexHeadDim, "is less than synthetic.qk_rope_head_dim %d (the indexer key carries the rope part)", m.QKRopeHeadDim)
		}
	}

	// Mamba.
	if mamba {
		m.MambaHeads = pick(s.MambaHeads, synthMambaHeads)
		m.MambaHeadDim = pick(s.MambaHeadDim, synthMambaDim)
		m.SSMStateSize = pick(s.SSMStateSize, synthSSMState)
		m.NGroups = pick(s.NGroups, max(1, min(synthNGroups, base.NGroups)))
		m.ConvKernel = pick(s.ConvKernel, max(2, min(synthConvKernel, base.ConvKernel)))
		if m.NGroups > m.MambaHeads {
			bad("n_groups", m.NGroups, "exceeds synthetic.mamba_heads %d", m.MambaHeads)
		} else if m.MambaHeads%m.NGroups != 0 {
			bad("mamba_heads", m.MambaHeads, "is not a multiple of synthetic.n_groups %d", m.NGroups)
		}
		if m.ConvKernel < 2 {
			bad("conv_kernel", m.ConvKernel, "is out of range; allowed: >= 2 (the conv state keeps conv_kernel-1 tokens)")
		}
		for _, f := range []struct {
			key string
			v   int
		}{{"mamba_heads", m.MambaHeads}, {"mamba_head_dim", m.MambaHeadDim}, {"ssm_state_size", m.SSMStateSize}, {"conv_kernel", m.ConvKernel}} {
			dim(f.key, f.v)
		}
	}

	// FFN.
	if dense {
		m.Intermediate = pick(s.Intermediate, min(2*m.Hidden, syntheticMaxDim))
		dim("intermediate", m.Intermediate)
	}
	if moe {
		m.MoEIntermediate = pick(s.MoEIntermediate, max(1, m.Hidden/2))
		m.Experts = pick(s.Experts, max(1, min(synthExperts, base.Experts)))
		m.ExpertsPerToken = pick(s.ExpertsPerToken, max(1, min(synthTopK, base.ExpertsPerToken, m.Experts)))
		m.SharedExperts = min(1, base.SharedExperts)
		if base.MoELatent > 0 {
			m.MoELatent = pick(s.MoELatent, max(1, m.Hidden/2))
			dim("moe_latent", m.MoELatent)
		}
		if m.ExpertsPerToken > m.Experts {
			bad("experts_per_token", m.ExpertsPerToken, "exceeds synthetic.experts %d", m.Experts)
		}
		dim("moe_intermediate", m.MoEIntermediate)
		dim("experts", m.Experts)
	}

	// Layers.
	nDec := pick(s.Layers, max(min(synthLayers, len(decoder)), len(kinds)))
	switch {
	case nDec > len(decoder):
		bad("layers", nDec, "exceeds the %d decoder layers of model %q", len(decoder), base.Name)
	case nDec < len(kinds):
		bad("layers", nDec, "is less than %d, the number of layer kinds of model %q (each kind is kept)", len(kinds), base.Name)
	}
	nMTP := pick(s.MTPLayers, len(mtp))
	if nMTP > 16 {
		bad("mtp_layers", nMTP, "exceeds the synthetic limit 16")
	}
	window := 0
	if windowed {
		window = pick(s.Window, min(synthWindow, baseWindow))
		if window > m.MaxPosition {
			bad("window", window, "exceeds synthetic.max_position %d", m.MaxPosition)
		}
	}
	if len(errs) > 0 {
		return spec.Model{}, errors.Join(errs...)
	}
	scale := func(l spec.Layer) spec.Layer {
		l.Buffers = nil
		if l.Window > 0 {
			l.Window = window
		}
		return l
	}
	for _, i := range representative(decoder, nDec) {
		m.Layers = append(m.Layers, scale(decoder[i]))
	}
	for i := range nMTP {
		m.Layers = append(m.Layers, scale(mtp[min(i, len(mtp)-1)]))
	}
	m.NumNextN = nMTP
	for i := range m.Layers {
		m.Layers[i].Index = i
	}
	if err := m.Validate(); err != nil {
		return spec.Model{}, err
	}
	return m, nil
}

// representative returns n sorted indices into layers: the first layer of
// each kind, then evenly spread indices (k*len/n), then the lowest unused
// ones. n must be in [kinds, len(layers)].
func representative(layers []spec.Layer, n int) []int {
	var out []int
	var seen []layerKind
	for i, l := range layers {
		if k := kindOf(l); !slices.Contains(seen, k) {
			seen = append(seen, k)
			out = append(out, i)
		}
	}
	for k := 0; len(out) < n && k < n; k++ {
		if i := k * len(layers) / n; !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	for i := 0; len(out) < n; i++ {
		if !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out
}
