package kernel

import (
	"math"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

// GDNWeights are one layer's own parameters; the kernel never retains them.
type GDNWeights struct {
	ConvW  []float32 // ConvDim × ConvKernel (conv1d weight, depthwise; no bias)
	DtBias []float32 // Heads
	A      []float32 // Heads: A = -exp(A_log)
	NormW  []float32 // VDim: the gated norm's gains, shared by the heads
}

// gdnL2Eps is transformers' l2norm epsilon (use_qk_l2norm_in_kernel).
const gdnL2Eps = 1e-6

func gdnCheckWeights(g kernelspec.GDN, w *GDNWeights) error {
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

// gdnTokens checks the per-token inputs and returns their count.
func gdnTokens(g kernelspec.GDN, qkv, z, b, a, out []float32) (int, error) {
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

// GDN runs n tokens of one sequence (qkv: n × ConvDim, z: n × Inner,
// b and a: n × Heads, out: n × Inner) from the state in conv and ssm (the
// layer's buffers in the sequence's state slot, ConvBytes and SSMBytes
// long) and leaves the state after the last token there. One token is
// decode, more a prefill chunk: the results are the same either way, bit
// for bit. Errors wrap kernelspec.ErrInvalid. The inputs are not modified.
func GDN(g kernelspec.GDN, w *GDNWeights, conv, ssm []byte, qkv, z, b, a, out []float32) error {
	n, err := gdnTokens(g, qkv, z, b, a, out)
	if err != nil {
		return err
	}
	if err := gdnCheckWeights(g, w); err != nil {
		return err
	}
	if len(conv) != g.ConvBytes() || len(ssm) != g.SSMBytes() {
		return invalidf("gdn: state of %d conv and %d ssm bytes, want %d and %d", len(conv), len(ssm), g.ConvBytes(), g.SSMBytes())
	}
	st := gdnNewState(g)
	decodeRow(g.ConvDtype, st.conv, conv)
	decodeRow(g.SSMDtype, st.ssm, ssm)
	cd, di, H := g.ConvDim(), g.Inner(), g.Heads
	for i := 0; i < n; i++ {
		gdnStep(g, w, st, qkv[i*cd:(i+1)*cd], z[i*di:(i+1)*di], b[i*H:(i+1)*H], a[i*H:(i+1)*H], out[i*di:(i+1)*di])
	}
	encodeRow(g.ConvDtype, conv, st.conv)
	encodeRow(g.SSMDtype, ssm, st.ssm)
	return nil
}

type gdnState struct {
	conv, ssm    []float32 // as laid out in the slot
	u, xc, kv, o []float32 // scratch
}

func gdnNewState(g kernelspec.GDN) *gdnState {
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
func gdnHeads(g kernelspec.GDN, w *GDNWeights, s, xc, z, b, a, kv, o, out []float32) {
	kd, K, V := g.KeyDim(), g.KDim, g.VDim
	q, k, v := xc[:kd], xc[kd:2*kd], xc[2*kd:]
	scale := float32(1 / math.Sqrt(float64(K)))
	for h := 0; h < g.KHeads; h++ {
		l2Scale(q[h*K:(h+1)*K], scale)
		l2Scale(k[h*K:(h+1)*K], 1)
	}
	per := g.Heads / g.KHeads
	round := g.SSMDtype != kernelspec.F32
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
func gdnStep(g kernelspec.GDN, w *GDNWeights, st *gdnState, qkv, z, b, a, out []float32) {
	cd, K := g.ConvDim(), g.ConvKernel
	u := st.u
	copy(u, qkv)
	Round(g.ConvDtype, u)
	gdnConv(cd, K, w.ConvW, u, st.xc, func(k, c int) float32 { return st.conv[k*cd+c] })
	if K > 1 {
		copy(st.conv, st.conv[cd:])
		copy(st.conv[(K-2)*cd:], u)
	}
	gdnHeads(g, w, st.ssm, st.xc, z, b, a, st.kv, st.o, out)
}

// DenseGDN is the dense reference of GDN: it runs all n tokens of
// a sequence from zero state, the conv reading its taps straight from the
// inputs (zero before the sequence) rather than from a state, and returns
// the final conv and recurrent state as float32 in the slot layouts.
// Bit-identical to any chunked GDN.
func DenseGDN(g kernelspec.GDN, w *GDNWeights, qkv, z, b, a, out []float32) (conv, ssm []float32, err error) {
	n, err := gdnTokens(g, qkv, z, b, a, out)
	if err != nil {
		return nil, nil, err
	}
	if err := gdnCheckWeights(g, w); err != nil {
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
		gdnHeads(g, w, s, xc, z[t*di:(t+1)*di], b[t*H:(t+1)*H], a[t*H:(t+1)*H], kv, o, out[t*di:(t+1)*di])
	}
	conv = make([]float32, (K-1)*cd)
	for k := 0; k < K-1; k++ {
		if src := n - (K - 1) + k; src >= 0 {
			copy(conv[k*cd:(k+1)*cd], u[src*cd:(src+1)*cd])
		}
	}
	return conv, s, nil
}
