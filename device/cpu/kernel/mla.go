package kernel

import (
	"runtime"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

// MLAWeights are the up-projections of kv_b_proj, split per head; the kernel
// reads them and never retains them.
type MLAWeights struct {
	UK []float32 // Heads × QKNopeHeadDim × KVLoraRank: k_nope[h] = UK[h] · c_kv
	UV []float32 // Heads × VHeadDim × KVLoraRank:      v[h]      = UV[h] · c_kv
}

// MLAInput is one sequence's step: n new tokens at positions Pos..Pos+n-1.
type MLAInput struct {
	Pos   int
	QNope []float32 // n × Heads × QKNopeHeadDim
	QPE   []float32 // n × Heads × QKRopeHeadDim
	CKV   []float32 // n × KVLoraRank (normed compressed KV of the new tokens)
	KPE   []float32 // n × QKRopeHeadDim (rope key of the new tokens)
}

// mlaCheck validates w and in and returns n; dense says in.CKV/KPE hold every
// position 0..Pos+n-1 rather than the n new ones.
func mlaCheck(m kernelspec.MLA, w *MLAWeights, in *MLAInput, out []float32, dense bool) (int, error) {
	if err := m.Validate(); err != nil {
		return 0, err
	}
	H, R := m.Heads, m.KVLoraRank
	if w == nil || len(w.UK) != H*m.QKNopeHeadDim*R || len(w.UV) != H*m.VHeadDim*R {
		var uk, uv int
		if w != nil {
			uk, uv = len(w.UK), len(w.UV)
		}
		return 0, invalidf("mla: len(UK) %d, len(UV) %d, want %d and %d", uk, uv, H*m.QKNopeHeadDim*R, H*m.VHeadDim*R)
	}
	if in.Pos < 0 {
		return 0, invalidf("mla: pos %d must be >= 0", in.Pos)
	}
	qn := H * m.QKNopeHeadDim
	if len(in.QNope)%qn != 0 {
		return 0, invalidf("mla: len(QNope) %d is not a multiple of heads×nope dim %d", len(in.QNope), qn)
	}
	n := len(in.QNope) / qn
	kv := n
	if dense {
		kv = in.Pos + n
	}
	switch {
	case len(in.QPE) != n*H*m.QKRopeHeadDim:
		return 0, invalidf("mla: len(QPE) %d, want %d (%d tokens)", len(in.QPE), n*H*m.QKRopeHeadDim, n)
	case len(in.CKV) != kv*R:
		return 0, invalidf("mla: len(CKV) %d, want %d (%d tokens × rank %d)", len(in.CKV), kv*R, kv, R)
	case len(in.KPE) != kv*m.QKRopeHeadDim:
		return 0, invalidf("mla: len(KPE) %d, want %d (%d tokens)", len(in.KPE), kv*m.QKRopeHeadDim, kv)
	case len(out) != n*H*m.VHeadDim:
		return 0, invalidf("mla: len(out) %d, want %d (%d tokens × heads × v dim)", len(out), n*H*m.VHeadDim, n)
	}
	return n, nil
}

// write stores the new tokens' rows (k_pe rotated).
func mlaWrite(m kernelspec.MLA, lat Paged, stride int, in *MLAInput, n int) {
	R, P := m.KVLoraRank, m.QKRopeHeadDim
	kp := make([]float32, P)
	rb := m.RowBytes()
	for i := 0; i < n; i++ {
		row := lat.rowAt(stride, rb, in.Pos+i)
		encodeRow(m.Dtype, row, in.CKV[i*R:(i+1)*R])
		copy(kp, in.KPE[i*P:(i+1)*P])
		RoPE(m.RoPE, kp, max(P, 1), in.Pos+i)
		encodeRow(m.Dtype, row[R*m.Dtype.Size():], kp)
	}
}

// mlaRotateQ returns q_pe rotated at the query positions (q itself when the RoPE is off).
func mlaRotateQ(m kernelspec.MLA, pos int, qpe []float32) []float32 {
	if !m.RoPE.On() {
		return qpe
	}
	w := m.Heads * m.QKRopeHeadDim
	r := append([]float32(nil), qpe...)
	for i := 0; i < len(r)/w; i++ {
		RoPE(m.RoPE, r[i*w:(i+1)*w], m.QKRopeHeadDim, pos+i)
	}
	return r
}

// MLA writes the new tokens' latent rows into lat, then computes every
// query's output (out: n × Heads × VHeadDim) against positions 0..p of the
// cache, new rows read back from it. See the type's doc for the formulas
// and order. Errors wrap kernelspec.ErrInvalid. in's slices are not modified.
func MLA(m kernelspec.MLA, lat Paged, w *MLAWeights, in MLAInput, out []float32) error {
	n, err := mlaCheck(m, w, &in, out, false)
	if err != nil || n == 0 {
		return err
	}
	stride, err := lat.check("mla latent", m.RowBytes(), 0, in.Pos+n)
	if err != nil {
		return err
	}
	mlaWrite(m, lat, stride, &in, n)
	mlaAttend(m, lat, stride, w, in.Pos, n, mlaRotateQ(m, in.Pos, in.QPE), in.QNope, nil, out)
	return nil
}

type mlaScratch struct{ scores, qlat, olat, row []float32 }

// headsPerUnit splits the heads of n queries into units of this many heads,
// enough units to keep GOMAXPROCS busy. Which heads share a unit does not
// change any head's arithmetic (rows are decoded exactly).
func headsPerUnit(heads, n int) int {
	procs := runtime.GOMAXPROCS(0)
	if n >= procs {
		return heads
	}
	split := min((procs+n-1)/n, heads)
	return (heads + split - 1) / split
}

// attend computes every query's heads; sel[i], when sel is not nil, lists
// query i's positions ascending, else it reads 0..p. One unit = one query ×
// a run of heads sharing each decoded latent row.
func mlaAttend(m kernelspec.MLA, lat Paged, stride int, w *MLAWeights, pos, n int, qpe, qnope []float32, sel [][]int32, out []float32) {
	H, R, P := m.Heads, m.KVLoraRank, m.QKRopeHeadDim
	ctx := pos + n
	if sel != nil {
		ctx = 0
		for _, s := range sel {
			ctx = max(ctx, len(s))
		}
	}
	hp := headsPerUnit(H, n)
	per := (H + hp - 1) / hp
	parallelFor(n*per, n*H*ctx*(2*R+P),
		func() *mlaScratch {
			return &mlaScratch{scores: make([]float32, hp*ctx), qlat: make([]float32, hp*R), olat: make([]float32, hp*R), row: make([]float32, R+P)}
		},
		func(s *mlaScratch, u int) {
			i, h0 := u/per, (u%per)*hp
			h1 := min(h0+hp, H)
			var pick []int32
			if sel != nil {
				pick = sel[i]
			}
			mlaAttendHeads(m, lat, stride, w, s, i, h0, h1, pos+i, qnope, qpe, pick, sel != nil, out)
		})
}

// absorb sets qlat[r] = Σ_d qn[d] * uk[d*R+r], d ascending from 0.
func absorb(qlat, qn, uk []float32) {
	R := len(qlat)
	clear(qlat)
	for d, x := range qn {
		row := uk[d*R : (d+1)*R]
		for r := range qlat {
			qlat[r] += float32(x * row[r])
		}
	}
}

// attendHeads computes heads h0..h1-1 of query i at position p.
func mlaAttendHeads(m kernelspec.MLA, lat Paged, stride int, w *MLAWeights, s *mlaScratch, i, h0, h1, p int, qnope, qpe []float32, pick []int32, sparse bool, out []float32) {
	R, N, V, P := m.KVLoraRank, m.QKNopeHeadDim, m.VHeadDim, m.QKRopeHeadDim
	G := h1 - h0
	ctx := p + 1
	if sparse {
		ctx = len(pick)
	}
	for g := 0; g < G; g++ {
		h := h0 + g
		absorb(s.qlat[g*R:(g+1)*R], qnope[(i*m.Heads+h)*N:][:N], w.UK[h*N*R:(h+1)*N*R])
	}
	scale := m.SoftmaxScale()
	rb := m.RowBytes()
	row := s.row
	cb := R * m.Dtype.Size()
	bf16 := m.Dtype == kernelspec.BF16
	score := func(k int, raw []byte) {
		if bf16 { // fused: two heads per pass over the row
			for g := 0; g < G; g += 2 {
				g2 := min(g+1, G-1)
				ca, cb2 := dot2BF16(s.qlat[g*R:(g+1)*R], s.qlat[g2*R:(g2+1)*R], raw[:cb])
				pa, pb := dot2BF16(qpe[(i*m.Heads+h0+g)*P:][:P], qpe[(i*m.Heads+h0+g2)*P:][:P], raw[cb:])
				s.scores[g*ctx+k] = (ca + pa) * scale
				s.scores[g2*ctx+k] = (cb2 + pb) * scale
			}
			return
		}
		decodeRow(m.Dtype, row, raw)
		for g := 0; g < G; g++ {
			q := qpe[(i*m.Heads+h0+g)*P:][:P]
			s.scores[g*ctx+k] = (Dot(s.qlat[g*R:(g+1)*R], row[:R]) + Dot(q, row[R:])) * scale
		}
	}
	olat := s.olat[:G*R]
	clear(olat)
	accum := func(k int, raw []byte) {
		g := 0
		if bf16 {
			for ; g+2 <= G; g += 2 {
				axpy2BF16(olat[g*R:(g+1)*R], olat[(g+1)*R:(g+2)*R], s.scores[g*ctx+k], s.scores[(g+1)*ctx+k], raw)
			}
			if g == G {
				return
			}
		}
		decodeRow(m.Dtype, row[:R], raw)
		for ; g < G; g++ {
			Axpy(olat[g*R:(g+1)*R], s.scores[g*ctx+k], row[:R])
		}
	}
	if sparse {
		for k, j := range pick {
			score(k, lat.rowAt(stride, rb, int(j)))
		}
	} else {
		for j := 0; j <= p; {
			base, cnt := lat.span(stride, j, p+1)
			for t := 0; t < cnt; t++ {
				score(j+t, base[t*stride:t*stride+rb])
			}
			j += cnt
		}
	}
	var ls [64]float32
	l := ls[:0]
	if G > len(ls) {
		l = make([]float32, 0, G)
	}
	for g := 0; g < G; g++ {
		l = append(l, expNormalize(s.scores[g*ctx:(g+1)*ctx]))
	}
	if sparse {
		for k, j := range pick {
			accum(k, lat.rowAt(stride, rb, int(j))[:cb])
		}
	} else {
		for j := 0; j <= p; {
			base, cnt := lat.span(stride, j, p+1)
			for t := 0; t < cnt; t++ {
				accum(j+t, base[t*stride:t*stride+cb])
			}
			j += cnt
		}
	}
	for g := 0; g < G; g++ {
		h := h0 + g
		o := olat[g*R : (g+1)*R]
		for r := range o {
			o[r] /= l[g]
		}
		uv := w.UV[h*V*R : (h+1)*V*R]
		dst := out[(i*m.Heads+h)*V:][:V]
		for e := range dst {
			dst[e] = Dot(uv[e*R:(e+1)*R], o)
		}
	}
}

// DenseMLA is the dense reference of MLA: no cache, naive loops.
// in.CKV and in.KPE hold every position 0..Pos+n-1 (before RoPE and before
// rounding: it rotates k_pe at each position and rounds to m.Dtype as the
// cache would); in.QNope and in.QPE hold the n queries at Pos..Pos+n-1. Its
// output is bit-identical to MLA's.
func DenseMLA(m kernelspec.MLA, w *MLAWeights, in MLAInput, out []float32) error {
	n, err := mlaCheck(m, w, &in, out, true)
	if err != nil {
		return err
	}
	c, kpe := mlaDenseLatents(m, in)
	qpe := mlaRotateQ(m, in.Pos, in.QPE)
	for i := 0; i < n; i++ {
		p := in.Pos + i
		all := make([]int32, p+1)
		for j := range all {
			all[j] = int32(j)
		}
		for h := 0; h < m.Heads; h++ {
			mlaDenseOne(m, w, c, kpe, h, in.QNope[(i*m.Heads+h)*m.QKNopeHeadDim:][:m.QKNopeHeadDim],
				qpe[(i*m.Heads+h)*m.QKRopeHeadDim:][:m.QKRopeHeadDim], all, out[(i*m.Heads+h)*m.VHeadDim:][:m.VHeadDim])
		}
	}
	return nil
}

// mlaDenseLatents returns the latents and rope keys of every position as the
// cache holds them (k_pe rotated, both rounded).
func mlaDenseLatents(m kernelspec.MLA, in MLAInput) (c, kpe []float32) {
	c = append([]float32(nil), in.CKV...)
	kpe = append([]float32(nil), in.KPE...)
	P := m.QKRopeHeadDim
	for t := 0; t < len(kpe)/max(P, 1); t++ {
		RoPE(m.RoPE, kpe[t*P:(t+1)*P], P, t)
	}
	Round(m.Dtype, c)
	Round(m.Dtype, kpe)
	return c, kpe
}

// denseOne is one head of one query over positions pos (ascending), written
// as plainly as possible.
func mlaDenseOne(m kernelspec.MLA, w *MLAWeights, c, kpe []float32, h int, qn, qpe []float32, pos []int32, out []float32) {
	R, N, V, P := m.KVLoraRank, m.QKNopeHeadDim, m.VHeadDim, m.QKRopeHeadDim
	qlat := make([]float32, R)
	for r := 0; r < R; r++ {
		var s float32
		for d := 0; d < N; d++ {
			s += float32(qn[d] * w.UK[(h*N+d)*R+r])
		}
		qlat[r] = s
	}
	s := make([]float32, len(pos))
	for k, j := range pos {
		s[k] = (Dot(qlat, c[int(j)*R:][:R]) + Dot(qpe, kpe[int(j)*P:][:P])) * m.SoftmaxScale()
	}
	mx := s[0]
	for _, x := range s {
		if x > mx {
			mx = x
		}
	}
	var l float32
	for k := range s {
		s[k] = exp32(s[k] - mx)
		l += s[k]
	}
	olat := make([]float32, R)
	for k, j := range pos {
		Axpy(olat, s[k], c[int(j)*R:][:R])
	}
	for r := range olat {
		olat[r] /= l
	}
	for e := 0; e < V; e++ {
		out[e] = Dot(w.UV[(h*V+e)*R:][:R], olat)
	}
}
