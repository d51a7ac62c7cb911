package kernelspec

// Mamba2 is the Mamba2 mixer's sequence part (after in_proj, before
// out_proj): a causal depthwise conv1d over (x, B, C), the selective-scan
// recurrence per head, the silu(z) gate and the grouped RMSNorm. It reads
// and writes one sequence's conv and SSM state in its state slot.
//
// Dimensions are per rank: d_inner = Heads*HeadDim, ConvDim = d_inner +
// 2*Groups*State (x, then B, then C, as in_proj splits xBC).
//
// State layouts (little-endian, at ConvDtype / SSMDtype):
//
//	conv: [ConvKernel-1][ConvDim]  the last ConvKernel-1 conv inputs, oldest first
//	ssm:  [Heads][HeadDim][State]
//
// ConvBytes and SSMBytes are what plugins/model.FillBuffers sizes the conv and
// ssm buffers with. A new sequence starts from zeroed state (clear both
// slices); a snapshot or restore is a copy of the state slot (CopyBlocks).
//
// Per token t, in this order (device/cpu/kernel's DenseMamba2 does the same):
//
//	u = xBC_t rounded to ConvDtype (so the conv sees the same inputs whether
//	    they come from the state or from this chunk)
//	conv_c = bias_c + Σ_k w[c][k] * in_k[c], k = 0..K-1 ascending, in_{K-1} = u,
//	    in_0..K-2 the conv state; xc = SiLU(conv_c); the state shifts in u
//	x, B, C = split(xc); head h uses group g = h / (Heads/Groups)
//	dt_h = Softplus(dt_t[h] + DtBias[h]), then max(dt_h, DtMin) when DtMin > 0;
//	    dA = exp(dt_h * A[h])
//	s[h][p][n] = s*dA + (dt_h*x[h][p]) * B[g][n], rounded to SSMDtype
//	y[h][p] = Σ_n s[h][p][n]*C[g][n] (n ascending, from 0) + D[h]*x[h][p]
//	y = y * SiLU(z_t), then RMSNorm over each of Groups groups of d_inner/Groups
//	    elements with weight NormW (Mamba2's RMSNormGated, norm after gate)
//
// The recurrence runs token by token for chunks too (no chunked SSD form),
// so a token's output and the state after it do not depend on chunking.
type Mamba2 struct {
	Heads      int // mamba heads (per rank)
	HeadDim    int
	State      int // ssm_state_size
	Groups     int // n_groups (per rank); divides Heads
	ConvKernel int // conv taps (>= 1)
	ConvDtype  Dtype
	SSMDtype   Dtype
	Eps        float32 // RMSNorm epsilon
	// DtMin, when > 0, is a floor on dt after the softplus: transformers'
	// chunked scan (its prefill) clamps dt to time_step_min, its
	// single-token decode step does not, so a device runs prompt tokens
	// with DtMin and generated ones without. 0 (the synthetic model): no
	// floor.
	DtMin float32
}

// Validate checks the dimensions.
func (m Mamba2) Validate() error {
	switch {
	case m.Heads <= 0 || m.HeadDim <= 0 || m.State <= 0:
		return invalidf("mamba2: heads %d, head dim %d, state %d must all be > 0", m.Heads, m.HeadDim, m.State)
	case m.Groups <= 0 || m.Heads%m.Groups != 0:
		return invalidf("mamba2: groups %d must be > 0 and divide heads %d", m.Groups, m.Heads)
	case m.ConvKernel < 1:
		return invalidf("mamba2: conv kernel %d must be >= 1", m.ConvKernel)
	case m.ConvDtype != F32 && m.ConvDtype != BF16:
		return invalidf("mamba2: conv dtype %v: allowed float32, bf16", m.ConvDtype)
	case m.SSMDtype != F32 && m.SSMDtype != BF16:
		return invalidf("mamba2: ssm dtype %v: allowed float32, bf16", m.SSMDtype)
	case !(m.DtMin >= 0):
		return invalidf("mamba2: dt floor %v must be >= 0", m.DtMin)
	}
	return nil
}

// Inner returns d_inner = Heads*HeadDim.
func (m Mamba2) Inner() int { return m.Heads * m.HeadDim }

// ConvDim returns the conv channels, Inner + 2*Groups*State.
func (m Mamba2) ConvDim() int { return m.Inner() + 2*m.Groups*m.State }

// ConvBytes returns the bytes of one sequence's conv state.
func (m Mamba2) ConvBytes() int { return (m.ConvKernel - 1) * m.ConvDim() * m.ConvDtype.Size() }

// SSMBytes returns the bytes of one sequence's SSM state.
func (m Mamba2) SSMBytes() int { return m.Heads * m.HeadDim * m.State * m.SSMDtype.Size() }

// GDN is Qwen3-Next's Gated DeltaNet mixer's sequence part (after
// in_proj_qkvz and in_proj_ba, before out_proj), as transformers 5.17's
// Qwen3NextGatedDeltaNet computes it on its pure-PyTorch path: a causal
// depthwise conv1d (no bias) with SiLU over the (q, k, v) channels, q and k
// L2-normalised per key head, q scaled by 1/sqrt(KDim), the gated delta
// rule per value head, then the gated RMSNorm per value head. It reads and
// writes one sequence's conv and recurrent state in its state slot.
//
// Dimensions are per rank: value heads Heads of VDim, key heads KHeads of
// KDim (KHeads divides Heads; value head h reads key head h / (Heads /
// KHeads), transformers' repeat_interleave); ConvDim = 2*KHeads*KDim +
// Heads*VDim: q of every key head, then k, then v of every value head.
//
// State layouts (little-endian, at ConvDtype / SSMDtype):
//
//	conv: [ConvKernel-1][ConvDim]  the last ConvKernel-1 conv inputs, oldest first
//	ssm:  [Heads][KDim][VDim]      transformers' recurrent state, S[h][k][v]
//
// Their sizes equal Mamba2's with Heads, HeadDim = VDim, State = KDim and
// Groups = KHeads (how plugins/model maps a GDN layer for sizing), so the
// state slots, snapshots and copies are the Mamba path's.
//
// Per token t, in this order (device/cpu/kernel's DenseGDN does the same):
//
//	u = qkv_t rounded to ConvDtype
//	conv_c = Σ_k w[c][k] * in_k[c], k = 0..K-1 ascending, in_{K-1} = u, in_0..K-2
//	    the conv state; xc = SiLU(conv_c); the state shifts in u
//	q, k, v = split(xc); per key head: q̂ = (q · r(q)) · 1/sqrt(KDim),
//	    k̂ = k · r(k), r(x) = 1/sqrt(Dot(x, x) + 1e-6) (transformers' l2norm)
//	per value head h: decay = exp(A[h] · Softplus(a_t[h] + DtBias[h])) (A =
//	    -exp(A_log)), β = sigmoid(b_t[h]);
//	    S *= decay (every element);
//	    kv[j] = Σ_i S[i][j]·k̂[i] (i ascending); δ[j] = (v[j] - kv[j])·β;
//	    S[i][j] += k̂[i]·δ[j], rounded to SSMDtype;
//	    o[j] = Σ_i S[i][j]·q̂[i] (i ascending)
//	out_h = RMSNorm(o, NormW, Eps) · SiLU(z_t[h]) (Qwen3NextRMSNormGated: norm, gains, then gate)
//
// The recurrence runs token by token for prefill chunks too. transformers
// runs prefill with its chunked algorithm (chunk_gated_delta_rule, 64-token
// blocks in a WY form) and decode with this recurrence; the two agree to
// about 1e-6, and kvx must be bit-identical across chunk sizes, managers
// and prefix reuse, so it computes the recurrence on every path in one
// fixed order. The goldens were chosen robust to that difference.
type GDN struct {
	Heads      int // value heads (linear_num_value_heads, per rank)
	KHeads     int // key heads (linear_num_key_heads, per rank); divides Heads
	KDim       int // linear_key_head_dim
	VDim       int // linear_value_head_dim
	ConvKernel int // conv taps (linear_conv_kernel_dim, >= 1)
	ConvDtype  Dtype
	SSMDtype   Dtype
	Eps        float32 // the gated RMSNorm's epsilon (rms_norm_eps)
}

// Validate checks the dimensions.
func (g GDN) Validate() error {
	switch {
	case g.Heads <= 0 || g.KHeads <= 0 || g.KDim <= 0 || g.VDim <= 0:
		return invalidf("gdn: value heads %d, key heads %d, key dim %d, value dim %d must all be > 0", g.Heads, g.KHeads, g.KDim, g.VDim)
	case g.Heads%g.KHeads != 0:
		return invalidf("gdn: key heads %d must divide value heads %d", g.KHeads, g.Heads)
	case g.ConvKernel < 1:
		return invalidf("gdn: conv kernel %d must be >= 1", g.ConvKernel)
	case g.ConvDtype != F32 && g.ConvDtype != BF16:
		return invalidf("gdn: conv dtype %v: allowed float32, bf16", g.ConvDtype)
	case g.SSMDtype != F32 && g.SSMDtype != BF16:
		return invalidf("gdn: ssm dtype %v: allowed float32, bf16", g.SSMDtype)
	case !(g.Eps >= 0):
		return invalidf("gdn: norm epsilon %v must be >= 0", g.Eps)
	}
	return nil
}

// Inner returns the output width, Heads*VDim.
func (g GDN) Inner() int { return g.Heads * g.VDim }

// KeyDim returns KHeads*KDim, the width of q (and of k).
func (g GDN) KeyDim() int { return g.KHeads * g.KDim }

// ConvDim returns the conv channels, 2*KeyDim + Inner.
func (g GDN) ConvDim() int { return 2*g.KeyDim() + g.Inner() }

// ConvBytes returns the bytes of one sequence's conv state.
func (g GDN) ConvBytes() int { return (g.ConvKernel - 1) * g.ConvDim() * g.ConvDtype.Size() }

// SSMBytes returns the bytes of one sequence's recurrent state.
func (g GDN) SSMBytes() int { return g.Heads * g.KDim * g.VDim * g.SSMDtype.Size() }
