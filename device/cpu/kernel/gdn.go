package kernel

import "math"

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
// Per token t, in this order (DenseGDN does the same):
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

// GDNWeights are one layer's own parameters; the kernel never retains them.
type GDNWeights struct {
	ConvW  []float32 // ConvDim × ConvKernel (conv1d weight, depthwise; no bias)
	DtBias []float32 // Heads
	A      []float32 // Heads: A = -exp(A_log)
	NormW  []float32 // VDim: the gated norm's gains, shared by the heads
}

// gdnL2Eps is transformers' l2norm epsilon (use_qk_l2norm_in_kernel).
const gdnL2Eps = 1e-6

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

func (g GDN) checkWeights(w *GDNWeights) error {
	if w == nil {
		return invalidf("gdn: nil weights")
	}
	cd := g.ConvDim()
	switch {
	case len(w.ConvW) != cd*g.ConvKernel:
		return invalidf("gdn: len(ConvW) %d, want %d (conv dim %d × kernel %d)", len(w.ConvW), cd*g.ConvKernel, cd, g.ConvKernel)
	case len(w.DtBias) != g.Heads || len(w.A) != g.Heads:
		return invalidf("gdn: len(DtBias) %d, len(A) %d, want value heads %d", len(w.DtBias), len(w.A), g.Heads)
	case len(w.NormW) != g.VDim:
		return invalidf("gdn: len(NormW) %d, want value dim %d", len(w.NormW), g.VDim)
	}
	return nil
}

// tokens checks the per-token inputs and returns their count.
func (g GDN) tokens(qkv, z, b, a, out []float32) (int, error) {
	if err := g.Validate(); err != nil {
		return 0, err
	}
	di := g.Inner()
	if len(z)%di != 0 {
		return 0, invalidf("gdn: len(z) %d is not a multiple of heads × value dim %d", len(z), di)
	}
	n := len(z) / di
	switch {
	case len(qkv) != n*g.ConvDim():
		return 0, invalidf("gdn: len(qkv) %d, want %d (%d tokens × conv dim %d)", len(qkv), n*g.ConvDim(), n, g.ConvDim())
	case len(b) != n*g.Heads || len(a) != n*g.Heads:
		return 0, invalidf("gdn: len(b) %d, len(a) %d, want %d (%d tokens × value heads %d)", len(b), len(a), n*g.Heads, n, g.Heads)
	case len(out) != n*di:
		return 0, invalidf("gdn: len(out) %d, want %d", len(out), n*di)
	}
	return n, nil
}

// Forward runs n tokens of one sequence (qkv: n × ConvDim, z: n × Inner,
// b and a: n × Heads, out: n × Inner) from the state in conv and ssm (the
// layer's buffers in the sequence's state slot, ConvBytes and SSMBytes
// long) and leaves the state after the last token there. One token is
// decode, more a prefill chunk: the results are the same either way, bit
// for bit. Errors wrap ErrInvalid. The inputs are not modified.
func (g GDN) Forward(w *GDNWeights, conv, ssm []byte, qkv, z, b, a, out []float32) error {
	n, err := g.tokens(qkv, z, b, a, out)
	if err != nil {
		return err
	}
	if err := g.checkWeights(w); err != nil {
		return err
	}
	if len(conv) != g.ConvBytes() || len(ssm) != g.SSMBytes() {
		return invalidf("gdn: state of %d conv and %d ssm bytes, want %d and %d", len(conv), len(ssm), g.ConvBytes(), g.SSMBytes())
	}
	st := g.newState()
	decodeRow(g.ConvDtype, st.conv, conv)
	decodeRow(g.SSMDtype, st.ssm, ssm)
	cd, di, H := g.ConvDim(), g.Inner(), g.Heads
	for i := 0; i < n; i++ {
		g.step(w, st, qkv[i*cd:(i+1)*cd], z[i*di:(i+1)*di], b[i*H:(i+1)*H], a[i*H:(i+1)*H], out[i*di:(i+1)*di])
	}
	encodeRow(g.ConvDtype, conv, st.conv)
	encodeRow(g.SSMDtype, ssm, st.ssm)
	return nil
}

type gdnState struct {
	conv, ssm    []float32 // as laid out in the slot
	u, xc, kv, o []float32 // scratch
}

func (g GDN) newState() *gdnState {
	cd := g.ConvDim()
	return &gdnState{
		conv: make([]float32, (g.ConvKernel-1)*cd),
		ssm:  make([]float32, g.Heads*g.KDim*g.VDim),
		u:    make([]float32, cd),
		xc:   make([]float32, cd),
		kv:   make([]float32, g.VDim),
		o:    make([]float32, g.VDim),
	}
}

// l2Scale sets x = (x · 1/sqrt(Dot(x, x) + 1e-6)) · s (s 1: no scaling).
func l2Scale(x []float32, s float32) {
	inv := float32(1 / math.Sqrt(float64(Dot(x, x)+gdnL2Eps)))
	for i, v := range x {
		x[i] = float32(v * inv)
		if s != 1 {
			x[i] = float32(x[i] * s)
		}
	}
}

// gdnConv runs the causal conv over one token's inputs u with taps
// in_0..K-2 = prev(k) and writes SiLU(conv) to xc.
func gdnConv(cd, K int, convW, u, xc []float32, prev func(k, c int) float32) {
	for c := 0; c < cd; c++ {
		var acc float32
		wc := convW[c*K : (c+1)*K]
		for k := 0; k < K-1; k++ {
			acc += float32(wc[k] * prev(k, c))
		}
		acc += float32(wc[K-1] * u[c])
		xc[c] = SiLU(acc)
	}
}

// gdnHeads runs the normalisation of q and k in xc and the delta rule of
// every value head on state s ([Heads][KDim][VDim]), writing the gated,
// normed output to out.
func (g GDN) gdnHeads(w *GDNWeights, s, xc, z, b, a, kv, o, out []float32) {
	kd, K, V := g.KeyDim(), g.KDim, g.VDim
	q, k, v := xc[:kd], xc[kd:2*kd], xc[2*kd:]
	scale := float32(1 / math.Sqrt(float64(K)))
	for h := 0; h < g.KHeads; h++ {
		l2Scale(q[h*K:(h+1)*K], scale)
		l2Scale(k[h*K:(h+1)*K], 1)
	}
	per := g.Heads / g.KHeads
	round := g.SSMDtype != F32
	for h := 0; h < g.Heads; h++ {
		kh := h / per
		qh, khv, vh := q[kh*K:(kh+1)*K], k[kh*K:(kh+1)*K], v[h*V:(h+1)*V]
		decay := exp32(float32(w.A[h] * Softplus(a[h]+w.DtBias[h])))
		beta := Sigmoid(b[h])
		S := s[h*K*V : (h+1)*K*V]
		for i := range S {
			S[i] = float32(S[i] * decay)
		}
		clear(kv)
		for i := 0; i < K; i++ {
			row, ki := S[i*V:(i+1)*V], khv[i]
			for j := range kv {
				kv[j] += float32(row[j] * ki)
			}
		}
		for j := range kv {
			kv[j] = float32((vh[j] - kv[j]) * beta) // δ
		}
		clear(o)
		for i := 0; i < K; i++ {
			row, ki, qi := S[i*V:(i+1)*V], khv[i], qh[i]
			for j := range row {
				nv := row[j] + float32(ki*kv[j])
				if round {
					nv = Float32FromBF16(BF16FromFloat32(nv))
				}
				row[j] = nv
				o[j] += float32(nv * qi)
			}
		}
		oh := out[h*V : (h+1)*V]
		RMSNorm(oh, o, w.NormW, g.Eps)
		zh := z[h*V : (h+1)*V]
		for j := range oh {
			oh[j] = float32(oh[j] * SiLU(zh[j]))
		}
	}
}

// step advances the state by one token and writes its output.
func (g GDN) step(w *GDNWeights, st *gdnState, qkv, z, b, a, out []float32) {
	cd, K := g.ConvDim(), g.ConvKernel
	u := st.u
	copy(u, qkv)
	Round(g.ConvDtype, u)
	gdnConv(cd, K, w.ConvW, u, st.xc, func(k, c int) float32 { return st.conv[k*cd+c] })
	if K > 1 {
		copy(st.conv, st.conv[cd:])
		copy(st.conv[(K-2)*cd:], u)
	}
	g.gdnHeads(w, st.ssm, st.xc, z, b, a, st.kv, st.o, out)
}

// DenseGDN is the dense reference of GDN.Forward: it runs all n tokens of
// a sequence from zero state, the conv reading its taps straight from the
// inputs (zero before the sequence) rather than from a state, and returns
// the final conv and recurrent state as float32 in the slot layouts.
// Bit-identical to any chunked Forward.
func DenseGDN(g GDN, w *GDNWeights, qkv, z, b, a, out []float32) (conv, ssm []float32, err error) {
	n, err := g.tokens(qkv, z, b, a, out)
	if err != nil {
		return nil, nil, err
	}
	if err := g.checkWeights(w); err != nil {
		return nil, nil, err
	}
	cd, di, K, H := g.ConvDim(), g.Inner(), g.ConvKernel, g.Heads
	u := append([]float32(nil), qkv...)
	Round(g.ConvDtype, u)
	s := make([]float32, H*g.KDim*g.VDim)
	xc, kv, o := make([]float32, cd), make([]float32, g.VDim), make([]float32, g.VDim)
	for t := 0; t < n; t++ {
		gdnConv(cd, K, w.ConvW, u[t*cd:(t+1)*cd], xc, func(k, c int) float32 {
			if src := t - (K - 1) + k; src >= 0 {
				return u[src*cd+c]
			}
			return 0
		})
		g.gdnHeads(w, s, xc, z[t*di:(t+1)*di], b[t*H:(t+1)*H], a[t*H:(t+1)*H], kv, o, out[t*di:(t+1)*di])
	}
	conv = make([]float32, (K-1)*cd)
	for k := 0; k < K-1; k++ {
		if src := n - (K - 1) + k; src >= 0 {
			copy(conv[k*cd:(k+1)*cd], u[src*cd:(src+1)*cd])
		}
	}
	return conv, s, nil
}
