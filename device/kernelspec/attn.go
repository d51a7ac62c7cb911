package kernelspec

import "math"

// GQA is grouped-query attention (MHA and MQA included) with an optional
// sliding window, over a paged K/V cache.
//
// Row layout of one token (RowBytes bytes, at Dtype, little-endian):
//
//	K[KVHeads][HeadDim] then V[KVHeads][HeadDim]
//
// i.e. 2*KVHeads*HeadDim*Dtype.Size() bytes, what plugins/model.FillBuffers
// sizes a GQA layer's kv buffer with (per-rank KVHeads).
//
// Query i at position p attends to the cached positions First(p) .. p.
// Per query and head, in this order (device/cpu/kernel's GQA and DenseGQA
// do the same): s_j = Dot(q, K_j) * SoftmaxScale for j ascending;
// m = max s_j; e_j = exp(s_j - m), l = Σ e_j (j ascending);
// acc = Σ e_j V_j (j ascending, Axpy); out = acc / l.
type GQA struct {
	Heads   int // query heads (per rank)
	KVHeads int // key/value heads; divides Heads; query head h uses kv head h/(Heads/KVHeads)
	HeadDim int
	Window  int     // attention window in tokens; 0 = full attention
	Scale   float32 // softmax scale; 0 = 1/sqrt(HeadDim)
	Dtype   Dtype   // cache dtype
	// RoPE, when Theta != 0, is applied by the kernel to q and to the new k
	// at their positions (before k is stored); Theta 0 = inputs come rotated.
	RoPE RoPE
}

// Validate checks the dimensions.
func (g GQA) Validate() error {
	switch {
	case g.Heads <= 0:
		return invalidf("gqa: heads %d must be > 0", g.Heads)
	case g.KVHeads <= 0 || g.Heads%g.KVHeads != 0:
		return invalidf("gqa: kv heads %d must be > 0 and divide heads %d", g.KVHeads, g.Heads)
	case g.HeadDim <= 0:
		return invalidf("gqa: head dim %d must be > 0", g.HeadDim)
	case g.Window < 0:
		return invalidf("gqa: window %d must be >= 0", g.Window)
	case !g.Dtype.valid():
		return invalidf("gqa: dtype %d: allowed bf16, fp8, float32", g.Dtype)
	}
	return g.RoPE.validate("gqa", g.HeadDim)
}

// RowBytes returns the bytes of one token's row.
func (g GQA) RowBytes() int { return 2 * g.KVHeads * g.HeadDim * g.Dtype.Size() }

// SoftmaxScale is the scale of the attention scores: Scale, or
// 1/sqrt(HeadDim) when it is 0.
func (g GQA) SoftmaxScale() float32 {
	if g.Scale != 0 {
		return g.Scale
	}
	return float32(1 / math.Sqrt(float64(g.HeadDim)))
}

// First returns the first position query position p attends to.
func (g GQA) First(p int) int {
	if g.Window > 0 && p-g.Window+1 > 0 {
		return p - g.Window + 1
	}
	return 0
}

// MLA is multi-head latent attention (DeepSeek-V2/V3) on the latent cache, in
// absorbed form: the up-projections never expand the cache; each query is
// absorbed into the latent space instead.
//
// Row layout of one token (RowBytes bytes, at Dtype, little-endian):
//
//	c_kv[KVLoraRank] then k_pe[QKRopeHeadDim]
//
// (KVLoraRank+QKRopeHeadDim)*Dtype.Size() bytes, what plugins/model.FillBuffers
// sizes the latent buffer with. c_kv is the compressed KV after its norm;
// k_pe is the shared rope key after RoPE. fp8 latents are stored without a
// scale (the model sizes none): a plain saturating e4m3 cast.
//
// Per query token at position p and head h, in this order (device/cpu/kernel's
// MLA, DenseMLA and the sparse path of its DSA do the same):
//
//	q_lat[r] = Σ_d q_nope[h][d] * UK[h][d][r]   (d ascending, from 0)
//	s_j      = (Dot(q_lat, c_j) + Dot(q_pe[h], k_pe_j)) * scale
//	e_j      = exp(s_j - max s), l = Σ e_j      (j ascending)
//	o_lat    = (Σ e_j c_j) / l                  (j ascending, Axpy)
//	out[h][e] = Dot(UV[h][e], o_lat)
//
// over j = 0..p (dense) or the selected positions, ascending (DSA). Prefill
// and decode use this same per-query formulation, so a token's output does
// not depend on how the sequence was chunked.
type MLA struct {
	Heads         int // query heads (per rank)
	KVLoraRank    int
	QKNopeHeadDim int
	QKRopeHeadDim int
	VHeadDim      int
	Scale         float32 // softmax scale; 0 = 1/sqrt(QKNopeHeadDim+QKRopeHeadDim)
	Dtype         Dtype   // latent cache dtype
	// RoPE, when Theta != 0, is applied by the kernel to q_pe and to the new
	// k_pe at their positions; its Dim must be QKRopeHeadDim. Theta 0 =
	// inputs come rotated.
	RoPE RoPE
}

// Validate checks the dimensions.
func (m MLA) Validate() error {
	switch {
	case m.Heads <= 0:
		return invalidf("mla: heads %d must be > 0", m.Heads)
	case m.KVLoraRank <= 0:
		return invalidf("mla: kv lora rank %d must be > 0", m.KVLoraRank)
	case m.QKNopeHeadDim <= 0:
		return invalidf("mla: qk nope head dim %d must be > 0", m.QKNopeHeadDim)
	case m.QKRopeHeadDim < 0:
		return invalidf("mla: qk rope head dim %d must be >= 0", m.QKRopeHeadDim)
	case m.VHeadDim <= 0:
		return invalidf("mla: v head dim %d must be > 0", m.VHeadDim)
	case !m.Dtype.valid():
		return invalidf("mla: dtype %d: allowed bf16, fp8, float32", m.Dtype)
	case m.RoPE.On() && m.RoPE.Dim != m.QKRopeHeadDim:
		return invalidf("mla: rope dim %d must equal qk rope head dim %d", m.RoPE.Dim, m.QKRopeHeadDim)
	}
	return m.RoPE.validate("mla", m.QKRopeHeadDim)
}

// RowBytes returns the bytes of one token's latent row.
func (m MLA) RowBytes() int { return (m.KVLoraRank + m.QKRopeHeadDim) * m.Dtype.Size() }

// SoftmaxScale is the scale of the attention scores: Scale, or
// 1/sqrt(QKNopeHeadDim+QKRopeHeadDim) when it is 0.
func (m MLA) SoftmaxScale() float32 {
	if m.Scale != 0 {
		return m.Scale
	}
	return float32(1 / math.Sqrt(float64(m.QKNopeHeadDim+m.QKRopeHeadDim)))
}

// Indexer is the DSA lightning indexer (DeepSeek-V3.2) over its paged key
// cache.
//
// Row layout of one token (RowBytes = HeadDim + 4 bytes):
//
//	fp8 e4m3 codes[HeadDim] then float32 scale (little-endian)
//
// what plugins/model.FillBuffers sizes the index_key buffer with. A key k is
// stored as scale = max(max|k_i|, 1e-4) / 448 and codes_i = FP8(k_i / scale)
// (QuantizeIndexKey).
//
// The score of query token p (Heads query vectors q_h, HeadDim each, and head
// weights w_h, the output of weights_proj already scaled as the model wants)
// for a cached position s <= p is
//
//	I(p, s) = (Σ_h w_h * ReLU(Dot(q_h, codes_s)))  * scale_s      (h ascending)
//
// with codes_s the fp8 values (dequantized exactly) and scale_s applied once
// at the end, as DeepSeek's fp8_index does. q stays float32 (DeepSeek
// quantizes it to fp8 too; the reference kernels do not). Any RoPE or
// Hadamard rotation of q and k is the caller's, before the call.
//
// With Plain set the keys are stored unquantized at dtype Keys (RowBytes =
// HeadDim × Keys.Size(), no scale), and the score is transformers 5.17's
// deepseek_v32 indexer (no Hadamard, no fp8):
//
//	I(p, s) = Σ_h w_h * ReLU(Dot(q_h, k_s) * Scale)                  (h ascending)
//
// (Scale 0 = 1). Either way positions tie only on equal scores, and TopK
// breaks ties to the lower position (torch.topk leaves them unspecified).
type Indexer struct {
	Heads   int // index_n_heads
	HeadDim int // index_head_dim
	TopK    int // index_topk
	Plain   bool
	Keys    Dtype   // the key dtype when Plain
	Scale   float32 // multiplies each head's dot product inside the ReLU when Plain (0 = 1)
}

// Validate checks the dimensions.
func (x Indexer) Validate() error {
	switch {
	case x.Heads <= 0:
		return invalidf("indexer: heads %d must be > 0", x.Heads)
	case x.HeadDim <= 0:
		return invalidf("indexer: head dim %d must be > 0", x.HeadDim)
	case x.TopK <= 0:
		return invalidf("indexer: top k %d must be > 0", x.TopK)
	case x.Plain && !x.Keys.valid():
		return invalidf("indexer: key dtype %d: allowed bf16, fp8, float32", x.Keys)
	}
	return nil
}

// RowBytes returns the bytes of one token's indexer key row.
func (x Indexer) RowBytes() int {
	if x.Plain {
		return x.HeadDim * x.Keys.Size()
	}
	return x.HeadDim + 4
}

// DSA is DeepSeek Sparse Attention: MLA on its latent cache, reading per
// query only the positions its lightning indexer selects.
type DSA struct {
	MLA     MLA
	Indexer Indexer
}

// Validate checks the dimensions.
func (d DSA) Validate() error {
	if err := d.MLA.Validate(); err != nil {
		return err
	}
	return d.Indexer.Validate()
}
