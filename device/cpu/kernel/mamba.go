package kernel

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
// Per token t, in this order (DenseMamba2 does the same):
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

// Mamba2Weights are one layer's mixer weights; the kernel never retains them.
type Mamba2Weights struct {
	ConvW  []float32 // ConvDim × ConvKernel (conv1d weight, depthwise)
	ConvB  []float32 // ConvDim
	DtBias []float32 // Heads
	A      []float32 // Heads: A = -exp(A_log)
	D      []float32 // Heads
	NormW  []float32 // Heads*HeadDim
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

func (m Mamba2) checkWeights(w *Mamba2Weights) error {
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

// tokens checks the per-token inputs and returns their count.
func (m Mamba2) tokens(z, xBC, dt, out []float32) (int, error) {
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

// Forward runs n tokens of one sequence (z: n × d_inner, xBC: n × ConvDim,
// dt: n × Heads, out: n × d_inner) from the state in conv and ssm (the
// layer's buffers in the sequence's state slot, ConvBytes and SSMBytes
// long) and leaves the state after the last token there. One token is
// decode; more is a prefill chunk; the results are the same either way.
// Errors wrap ErrInvalid. z, xBC, dt are not modified.
func (m Mamba2) Forward(w *Mamba2Weights, conv, ssm []byte, z, xBC, dt, out []float32) error {
	n, err := m.tokens(z, xBC, dt, out)
	if err != nil {
		return err
	}
	if err := m.checkWeights(w); err != nil {
		return err
	}
	if len(conv) != m.ConvBytes() || len(ssm) != m.SSMBytes() {
		return invalidf("mamba2: state of %d conv and %d ssm bytes, want %d and %d", len(conv), len(ssm), m.ConvBytes(), m.SSMBytes())
	}
	st := m.newState()
	decodeRow(m.ConvDtype, st.conv, conv)
	decodeRow(m.SSMDtype, st.ssm, ssm)
	cd, di := m.ConvDim(), m.Inner()
	for i := 0; i < n; i++ {
		m.step(w, st, z[i*di:(i+1)*di], xBC[i*cd:(i+1)*cd], dt[i*m.Heads:(i+1)*m.Heads], out[i*di:(i+1)*di])
	}
	encodeRow(m.ConvDtype, conv, st.conv)
	encodeRow(m.SSMDtype, ssm, st.ssm)
	return nil
}

type mambaState struct {
	conv, ssm []float32 // as laid out in the slot
	u, xc, y  []float32 // scratch
}

func (m Mamba2) newState() *mambaState {
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
func (m Mamba2) dtOf(dt, bias float32) float32 {
	v := Softplus(dt + bias)
	if m.DtMin > 0 {
		v = max(v, m.DtMin)
	}
	return v
}

// step advances the state by one token and writes its output.
func (m Mamba2) step(w *Mamba2Weights, st *mambaState, z, xBC, dt, out []float32) {
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
	round := m.SSMDtype != F32
	for h := 0; h < m.Heads; h++ {
		g := h / hpg
		dth := m.dtOf(dt[h], w.DtBias[h])
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

// DenseMamba2 is the dense reference of Mamba2.Forward: it runs all n tokens
// of a sequence from zero state, the recurrence written out with plain
// float32 slices (no state slot), and returns the final conv and SSM state
// as float32 in the slot layouts. Bit-identical to any chunked Forward.
func DenseMamba2(m Mamba2, w *Mamba2Weights, z, xBC, dt, out []float32) (conv, ssm []float32, err error) {
	n, err := m.tokens(z, xBC, dt, out)
	if err != nil {
		return nil, nil, err
	}
	if err := m.checkWeights(w); err != nil {
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
			dth := m.dtOf(dt[t*m.Heads+h], w.DtBias[h])
			dA := exp32(dth * w.A[h])
			for p := 0; p < P; p++ {
				xv := x[h*P+p]
				var acc float32
				for j := 0; j < N; j++ {
					i := (h*P+p)*N + j
					s[i] = float32(s[i]*dA) + float32(dth*xv*B[g*N+j])
					if m.SSMDtype == BF16 {
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
