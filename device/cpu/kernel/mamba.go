package kernel

import "github.com/kvx-dev/kvx/device/kernelspec"

// Mamba2Weights are one layer's mixer weights; the kernel never retains them.
type Mamba2Weights struct {
	ConvW  []float32 // ConvDim × ConvKernel (conv1d weight, depthwise)
	ConvB  []float32 // ConvDim
	DtBias []float32 // Heads
	A      []float32 // Heads: A = -exp(A_log)
	D      []float32 // Heads
	NormW  []float32 // Heads*HeadDim
}

func mamba2CheckWeights(m kernelspec.Mamba2, w *Mamba2Weights) error {
	if w == nil {
		return invalidf("mamba2: nil weights")
	}
	cd, H := m.ConvDim(), m.Heads
	switch {
	case len(w.ConvW) != cd*m.ConvKernel:
		return invalidf("mamba2: len(ConvW) %d, want %d (conv dim %d × kernel %d)", len(w.ConvW), cd*m.ConvKernel, cd, m.ConvKernel)
	case len(w.ConvB) != cd:
		return invalidf("mamba2: len(ConvB) %d, want conv dim %d", len(w.ConvB), cd)
	case len(w.DtBias) != H || len(w.A) != H || len(w.D) != H:
		return invalidf("mamba2: len(DtBias) %d, len(A) %d, len(D) %d, want heads %d", len(w.DtBias), len(w.A), len(w.D), H)
	case len(w.NormW) != m.Inner():
		return invalidf("mamba2: len(NormW) %d, want %d", len(w.NormW), m.Inner())
	}
	return nil
}

// mamba2Tokens checks the per-token inputs and returns their count.
func mamba2Tokens(m kernelspec.Mamba2, z, xBC, dt, out []float32) (int, error) {
	if err := m.Validate(); err != nil {
		return 0, err
	}
	di := m.Inner()
	if len(z)%di != 0 {
		return 0, invalidf("mamba2: len(z) %d is not a multiple of d_inner %d", len(z), di)
	}
	n := len(z) / di
	switch {
	case len(xBC) != n*m.ConvDim():
		return 0, invalidf("mamba2: len(xBC) %d, want %d (%d tokens × conv dim %d)", len(xBC), n*m.ConvDim(), n, m.ConvDim())
	case len(dt) != n*m.Heads:
		return 0, invalidf("mamba2: len(dt) %d, want %d (%d tokens × heads %d)", len(dt), n*m.Heads, n, m.Heads)
	case len(out) != n*di:
		return 0, invalidf("mamba2: len(out) %d, want %d", len(out), n*di)
	}
	return n, nil
}

// Mamba2 runs n tokens of one sequence (z: n × d_inner, xBC: n × ConvDim,
// dt: n × Heads, out: n × d_inner) from the state in conv and ssm (the
// layer's buffers in the sequence's state slot, ConvBytes and SSMBytes
// long) and leaves the state after the last token there. One token is
// decode; more is a prefill chunk; the results are the same either way.
// Errors wrap kernelspec.ErrInvalid. z, xBC, dt are not modified.
func Mamba2(m kernelspec.Mamba2, w *Mamba2Weights, conv, ssm []byte, z, xBC, dt, out []float32) error {
	n, err := mamba2Tokens(m, z, xBC, dt, out)
	if err != nil {
		return err
	}
	if err := mamba2CheckWeights(m, w); err != nil {
		return err
	}
	if len(conv) != m.ConvBytes() || len(ssm) != m.SSMBytes() {
		return invalidf("mamba2: state of %d conv and %d ssm bytes, want %d and %d", len(conv), len(ssm), m.ConvBytes(), m.SSMBytes())
	}
	st := mamba2NewState(m)
	decodeRow(m.ConvDtype, st.conv, conv)
	decodeRow(m.SSMDtype, st.ssm, ssm)
	cd, di := m.ConvDim(), m.Inner()
	for i := 0; i < n; i++ {
		mamba2Step(m, w, st, z[i*di:(i+1)*di], xBC[i*cd:(i+1)*cd], dt[i*m.Heads:(i+1)*m.Heads], out[i*di:(i+1)*di])
	}
	encodeRow(m.ConvDtype, conv, st.conv)
	encodeRow(m.SSMDtype, ssm, st.ssm)
	return nil
}

type mambaState struct {
	conv, ssm []float32 // as laid out in the slot
	u, xc, y  []float32 // scratch
}

func mamba2NewState(m kernelspec.Mamba2) *mambaState {
	cd := m.ConvDim()
	return &mambaState{
		conv: make([]float32, (m.ConvKernel-1)*cd),
		ssm:  make([]float32, m.Heads*m.HeadDim*m.State),
		u:    make([]float32, cd),
		xc:   make([]float32, cd),
		y:    make([]float32, m.Inner()),
	}
}

// dtOf is head h's step: Softplus(dt + bias), floored at DtMin when set.
func mamba2DtOf(m kernelspec.Mamba2, dt, bias float32) float32 {
	v := Softplus(dt + bias)
	if m.DtMin > 0 {
		v = max(v, m.DtMin)
	}
	return v
}

// step advances the state by one token and writes its output.
func mamba2Step(m kernelspec.Mamba2, w *Mamba2Weights, st *mambaState, z, xBC, dt, out []float32) {
	cd, K := m.ConvDim(), m.ConvKernel
	u := st.u
	copy(u, xBC)
	Round(m.ConvDtype, u)
	for c := 0; c < cd; c++ {
		acc := w.ConvB[c]
		wc := w.ConvW[c*K : (c+1)*K]
		for k := 0; k < K-1; k++ {
			acc += float32(wc[k] * st.conv[k*cd+c])
		}
		acc += float32(wc[K-1] * u[c])
		st.xc[c] = SiLU(acc)
	}
	if K > 1 {
		copy(st.conv, st.conv[cd:])
		copy(st.conv[(K-2)*cd:], u)
	}
	di, N, P := m.Inner(), m.State, m.HeadDim
	x := st.xc[:di]
	B := st.xc[di : di+m.Groups*N]
	C := st.xc[di+m.Groups*N:]
	hpg := m.Heads / m.Groups
	round := m.SSMDtype != kernelspec.F32
	for h := 0; h < m.Heads; h++ {
		g := h / hpg
		dth := mamba2DtOf(m, dt[h], w.DtBias[h])
		dA := exp32(dth * w.A[h])
		Bg, Cg := B[g*N:(g+1)*N], C[g*N:(g+1)*N]
		for p := 0; p < P; p++ {
			xv := x[h*P+p]
			dtx := dth * xv
			s := st.ssm[(h*P+p)*N : (h*P+p+1)*N]
			var y float32
			for n := range s {
				v := float32(s[n]*dA) + float32(dtx*Bg[n])
				if round {
					v = Float32FromBF16(BF16FromFloat32(v))
				}
				s[n] = v
				y += float32(v * Cg[n])
			}
			st.y[h*P+p] = y + float32(w.D[h]*xv)
		}
	}
	for i := range st.y {
		st.y[i] *= SiLU(z[i])
	}
	gs := di / m.Groups
	for g := 0; g < m.Groups; g++ {
		RMSNorm(out[g*gs:(g+1)*gs], st.y[g*gs:(g+1)*gs], w.NormW[g*gs:(g+1)*gs], m.Eps)
	}
}

// DenseMamba2 is the dense reference of Mamba2: it runs all n tokens
// of a sequence from zero state, the recurrence written out with plain
// float32 slices (no state slot), and returns the final conv and SSM state
// as float32 in the slot layouts. Bit-identical to any chunked Mamba2.
func DenseMamba2(m kernelspec.Mamba2, w *Mamba2Weights, z, xBC, dt, out []float32) (conv, ssm []float32, err error) {
	n, err := mamba2Tokens(m, z, xBC, dt, out)
	if err != nil {
		return nil, nil, err
	}
	if err := mamba2CheckWeights(m, w); err != nil {
		return nil, nil, err
	}
	cd, di, K, N, P := m.ConvDim(), m.Inner(), m.ConvKernel, m.State, m.HeadDim
	u := append([]float32(nil), xBC...)
	Round(m.ConvDtype, u) // every conv input as the state would hold it
	s := make([]float32, m.Heads*P*N)
	for t := 0; t < n; t++ {
		xc := make([]float32, cd)
		for c := 0; c < cd; c++ {
			acc := w.ConvB[c]
			for k := 0; k < K; k++ {
				src := t - (K - 1) + k // the input k taps back; before the sequence: zero
				var in float32
				if src >= 0 {
					in = u[src*cd+c]
				}
				acc += float32(w.ConvW[c*K+k] * in)
			}
			xc[c] = SiLU(acc)
		}
		x, B, C := xc[:di], xc[di:di+m.Groups*N], xc[di+m.Groups*N:]
		y := make([]float32, di)
		for h := 0; h < m.Heads; h++ {
			g := h / (m.Heads / m.Groups)
			dth := mamba2DtOf(m, dt[t*m.Heads+h], w.DtBias[h])
			dA := exp32(dth * w.A[h])
			for p := 0; p < P; p++ {
				xv := x[h*P+p]
				var acc float32
				for j := 0; j < N; j++ {
					i := (h*P+p)*N + j
					s[i] = float32(s[i]*dA) + float32(dth*xv*B[g*N+j])
					if m.SSMDtype == kernelspec.BF16 {
						s[i] = Float32FromBF16(BF16FromFloat32(s[i]))
					}
					acc += float32(s[i] * C[g*N+j])
				}
				y[h*P+p] = acc + float32(w.D[h]*xv)
			}
		}
		gs := di / m.Groups
		for i := range y {
			y[i] *= SiLU(z[t*di+i])
		}
		for g := 0; g < m.Groups; g++ {
			RMSNorm(out[t*di+g*gs:t*di+(g+1)*gs], y[g*gs:(g+1)*gs], w.NormW[g*gs:(g+1)*gs], m.Eps)
		}
	}
	conv = make([]float32, (K-1)*cd)
	for k := 0; k < K-1; k++ {
		if src := n - (K - 1) + k; src >= 0 {
			copy(conv[k*cd:(k+1)*cd], u[src*cd:(src+1)*cd])
		}
	}
	return conv, s, nil
}
