package kernel

import (
	"github.com/kvx-dev/kvx/device/kernelspec"
)

// gqaTokens checks the input lengths and returns the number of new tokens.
func gqaTokens(g kernelspec.GQA, pos int, q, out []float32) (int, error) {
	if err := g.Validate(); err != nil {
		return 0, err
	}
	qw := g.Heads * g.HeadDim
	if pos < 0 {
		return 0, invalidf("gqa: pos %d must be >= 0", pos)
	}
	if len(q)%qw != 0 {
		return 0, invalidf("gqa: len(q) %d is not a multiple of heads×head dim %d", len(q), qw)
	}
	n := len(q) / qw
	if len(out) != n*qw {
		return 0, invalidf("gqa: len(out) %d, want %d (%d tokens × %d)", len(out), n*qw, n, qw)
	}
	return n, nil
}

// GQA runs one sequence's step of g: it writes the n new tokens' K and V
// (k, v: n × KVHeads × HeadDim, token i at position pos+i) into kv, then for
// each query i (q: n × Heads × HeadDim) at position p = pos+i attends to the
// cached positions max(0, p-Window+1) .. p (Window 0: 0 .. p) and writes out
// (n × Heads × HeadDim). A prefill chunk, one decode token and 1+draft MTP
// verification tokens are all the same call. Positions before pos must have
// been written by earlier calls.
//
// Per query and head it computes in kernelspec.GQA's order (DenseGQA does
// the same on float32). K and V are read back from the cache, so out depends only on the logical
// contents, never on placement, block size, chunking or GOMAXPROCS.
//
// Errors (wrapping kernelspec.ErrInvalid): bad dimensions, lengths, pos, or a table
// that does not cover pos+n-1 with valid blocks (entries before the first
// block the window reads are not checked). q, k, v are not modified.
func GQA(g kernelspec.GQA, kv Paged, pos int, q, k, v, out []float32) error {
	n, err := gqaTokens(g, pos, q, out)
	if err != nil {
		return err
	}
	kw := g.KVHeads * g.HeadDim
	if len(k) != n*kw || len(v) != n*kw {
		return invalidf("gqa: len(k) %d, len(v) %d, want %d (%d tokens × %d)", len(k), len(v), n*kw, n, kw)
	}
	if n == 0 {
		return nil
	}
	rb := g.RowBytes()
	stride, err := kv.check("gqa kv", rb, g.First(pos), pos+n)
	if err != nil {
		return err
	}
	// Write the new rows.
	sz := g.Dtype.Size()
	kr := make([]float32, kw)
	for i := 0; i < n; i++ {
		copy(kr, k[i*kw:(i+1)*kw])
		RoPE(g.RoPE, kr, g.HeadDim, pos+i)
		row := kv.rowAt(stride, rb, pos+i)
		encodeRow(g.Dtype, row, kr)
		encodeRow(g.Dtype, row[kw*sz:], v[i*kw:(i+1)*kw])
	}
	qr := gqaRotateQ(g, pos, q)
	G := g.Heads / g.KVHeads
	ctx := pos + n
	if g.Window > 0 && g.Window < ctx {
		ctx = g.Window
	}
	// One unit = one query token × one kv head, i.e. the G query heads that
	// share that kv head: each K/V row is decoded once for all of them. Each
	// head's arithmetic is exactly the per-head formula (decoding is exact).
	parallelFor(n*g.KVHeads, n*g.Heads*ctx*g.HeadDim*2,
		func() *gqaScratch {
			return &gqaScratch{scores: make([]float32, G*ctx), row: make([]float32, g.HeadDim), acc: make([]float32, G*g.HeadDim)}
		},
		func(s *gqaScratch, u int) {
			i, kh := u/g.KVHeads, u%g.KVHeads
			at := (i*g.Heads + kh*G) * g.HeadDim
			gqaAttendGroup(g, kv, stride, s, qr[at:at+G*g.HeadDim], pos+i, kh, out[at:at+G*g.HeadDim])
		})
	return nil
}

func gqaRotateQ(g kernelspec.GQA, pos int, q []float32) []float32 {
	if !g.RoPE.On() {
		return q
	}
	qw := g.Heads * g.HeadDim
	qr := make([]float32, len(q))
	copy(qr, q)
	for i := 0; i < len(q)/qw; i++ {
		RoPE(g.RoPE, qr[i*qw:(i+1)*qw], g.HeadDim, pos+i)
	}
	return qr
}

type gqaScratch struct{ scores, row, acc []float32 }

// attendGroup computes the G = Heads/KVHeads query heads of kv head kh for
// the query at position p: q and out are G × HeadDim.
func gqaAttendGroup(g kernelspec.GQA, kv Paged, stride int, s *gqaScratch, q []float32, p, kh int, out []float32) {
	D := g.HeadDim
	G := len(q) / D
	lo := g.First(p)
	ctx := p + 1 - lo
	sz := g.Dtype.Size()
	koff := kh * D * sz
	voff := (g.KVHeads + kh) * D * sz
	kb := D * sz
	scale := g.SoftmaxScale()
	row := s.row
	// Pass 1: scores[h*ctx + j-lo], one block base per block, one decode per row.
	for j := lo; j <= p; {
		base, cnt := kv.span(stride, j, p+1)
		for t := 0; t < cnt; t++ {
			r := base[t*stride+koff:][:kb]
			if g.Dtype == kernelspec.BF16 { // fused: two heads per pass over the row
				for h := 0; h < G; h += 2 {
					h2 := min(h+1, G-1)
					sa, sb := dot2BF16(q[h*D:(h+1)*D], q[h2*D:(h2+1)*D], r)
					s.scores[h*ctx+j-lo+t] = sa * scale
					s.scores[h2*ctx+j-lo+t] = sb * scale
				}
				continue
			}
			decodeRow(g.Dtype, row, r)
			for h := 0; h < G; h++ {
				s.scores[h*ctx+j-lo+t] = Dot(q[h*D:(h+1)*D], row) * scale
			}
		}
		j += cnt
	}
	var ls [64]float32
	l := ls[:0]
	if G > len(ls) {
		l = make([]float32, 0, G)
	}
	for h := 0; h < G; h++ {
		l = append(l, expNormalize(s.scores[h*ctx:(h+1)*ctx]))
	}
	acc := s.acc[:G*D]
	clear(acc)
	for j := lo; j <= p; {
		base, cnt := kv.span(stride, j, p+1)
		for t := 0; t < cnt; t++ {
			r := base[t*stride+voff:][:kb]
			if g.Dtype == kernelspec.BF16 {
				h := 0
				for ; h+2 <= G; h += 2 {
					axpy2BF16(acc[h*D:(h+1)*D], acc[(h+1)*D:(h+2)*D], s.scores[h*ctx+j-lo+t], s.scores[(h+1)*ctx+j-lo+t], r)
				}
				if h < G { // odd G: the last head alone
					decodeRow(g.Dtype, row, r)
					Axpy(acc[h*D:(h+1)*D], s.scores[h*ctx+j-lo+t], row)
				}
				continue
			}
			decodeRow(g.Dtype, row, r)
			for h := 0; h < G; h++ {
				Axpy(acc[h*D:(h+1)*D], s.scores[h*ctx+j-lo+t], row)
			}
		}
		j += cnt
	}
	for h := 0; h < G; h++ {
		for d := 0; d < D; d++ {
			out[h*D+d] = acc[h*D+d] / l[h]
		}
	}
}

// expNormalize replaces s_j by e_j = exp(s_j - max) and returns Σ e_j
// (j ascending): the softmax numerators and denominator.
func expNormalize(s []float32) float32 {
	m := s[0]
	for _, v := range s[1:] {
		if v > m {
			m = v
		}
	}
	var l float32
	for j, v := range s {
		e := exp32(v - m)
		s[j] = e
		l += e
	}
	return l
}

// span returns the bytes from logical position j's row to the end of the
// pool data, and how many rows of j's block, starting at j and below hi,
// lie there (rows at base[t*stride:]). The block base is resolved once.
func (p Paged) span(stride, j, hi int) ([]byte, int) {
	b := j / p.TokensPerBlock
	t := j - b*p.TokensPerBlock
	cnt := p.TokensPerBlock - t
	if j+cnt > hi {
		cnt = hi - j
	}
	at := int(p.Table[b])*p.BlockBytes + p.Offset + t*stride
	return p.Data[at:], cnt
}

// DenseGQA is the dense reference of GQA: no cache, naive loops.
// k and v hold every position 0 .. pos+n-1 (T × KVHeads × HeadDim, before
// RoPE and before rounding: it rotates each k at its position and rounds k
// and v to g.Dtype, as the cache would); q holds the n queries at pos ..
// pos+n-1 (n × Heads × HeadDim); out is n × Heads × HeadDim. Its output is
// bit-identical to GQA's for the same inputs.
func DenseGQA(g kernelspec.GQA, pos int, q, k, v, out []float32) error {
	n, err := gqaTokens(g, pos, q, out)
	if err != nil {
		return err
	}
	kw := g.KVHeads * g.HeadDim
	if len(k) != (pos+n)*kw || len(v) != (pos+n)*kw {
		return invalidf("gqa dense: len(k) %d, len(v) %d, want %d (%d positions × %d)", len(k), len(v), (pos+n)*kw, pos+n, kw)
	}
	kc := append([]float32(nil), k...)
	vc := append([]float32(nil), v...)
	for t := 0; t < pos+n; t++ {
		RoPE(g.RoPE, kc[t*kw:(t+1)*kw], g.HeadDim, t)
	}
	Round(g.Dtype, kc)
	Round(g.Dtype, vc)
	denseGQA(g, pos, gqaRotateQ(g, pos, q), kc, vc, out)
	return nil
}

// denseGQA is DenseGQA on rotated q and rotated, rounded k and v.
func denseGQA(g kernelspec.GQA, pos int, q, k, v, out []float32) {
	D, kw := g.HeadDim, g.KVHeads*g.HeadDim
	n := len(q) / (g.Heads * D)
	for i := 0; i < n; i++ {
		p := pos + i
		lo := g.First(p)
		for h := 0; h < g.Heads; h++ {
			kh := h / (g.Heads / g.KVHeads)
			qv := q[(i*g.Heads+h)*D:][:D]
			s := make([]float32, p+1-lo)
			for j := lo; j <= p; j++ {
				s[j-lo] = Dot(qv, k[j*kw+kh*D:][:D]) * g.SoftmaxScale()
			}
			m := s[0]
			for _, x := range s {
				if x > m {
					m = x
				}
			}
			var l float32
			for j := range s {
				s[j] = exp32(s[j] - m)
				l += s[j]
			}
			acc := make([]float32, D)
			for j := lo; j <= p; j++ {
				Axpy(acc, s[j-lo], v[j*kw+kh*D:][:D])
			}
			o := out[(i*g.Heads+h)*D:][:D]
			for d := range o {
				o[d] = acc[d] / l
			}
		}
	}
}
