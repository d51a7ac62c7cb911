package kernel

import (
	"container/heap"
	"encoding/binary"
	"math"
	"slices"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

// indexStoreKey writes key k as one indexer row into dst.
func indexStoreKey(x kernelspec.Indexer, dst []byte, k []float32) {
	if x.Plain {
		encodeRow(x.Keys, dst, k)
		return
	}
	QuantizeIndexKey(dst, k)
}

// plainScore is I(p, s) of the Plain layout for key k (decoded).
func indexPlainScore(x kernelspec.Indexer, q, w, k []float32) float32 {
	D := x.HeadDim
	sc := x.Scale
	if sc == 0 {
		sc = 1
	}
	var acc float32
	for h := 0; h < x.Heads; h++ {
		acc += float32(w[h] * relu(float32(Dot(q[h*D:(h+1)*D], k)*sc)))
	}
	return acc
}

// QuantizeIndexKey stores key k as one indexer row into dst (len(dst) >=
// len(k)+4): fp8 codes, then the float32 scale. NaN elements are ignored by
// the max. It panics if dst is too short.
func QuantizeIndexKey(dst []byte, k []float32) {
	var amax float32
	for _, v := range k {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax = a
		}
	}
	scale := max(amax, 1e-4) / FP8Max
	dst = dst[:len(k)+4]
	for i, v := range k {
		dst[i] = FP8FromFloat32(v / scale)
	}
	binary.LittleEndian.PutUint32(dst[len(k):], math.Float32bits(scale))
}

// DequantizeIndexKey returns the fp8 values of a stored row (without the
// scale) and its scale, for references and tests.
func DequantizeIndexKey(row []byte, headDim int) (codes []float32, scale float32) {
	codes = make([]float32, headDim)
	decodeRow(kernelspec.FP8, codes, row)
	return codes, math.Float32frombits(binary.LittleEndian.Uint32(row[headDim:]))
}

// indexScore is I(p, s) for one stored row.
func indexScore(x kernelspec.Indexer, q, w []float32, row []byte) float32 {
	D := x.HeadDim
	var acc float32
	for h := 0; h < x.Heads; h++ {
		acc += float32(w[h] * relu(dotFP8(q[h*D:(h+1)*D], row[:D])))
	}
	return acc * math.Float32frombits(binary.LittleEndian.Uint32(row[D:]))
}

// relu returns max(x, 0); -0 and NaN pass through.
func relu(x float32) float32 {
	if x < 0 {
		return 0
	}
	return x
}

// TopK returns the positions (ascending) of the k best scores, score s[j]
// being position j's: higher score first, then lower position; NaN ranks
// below every number. All positions when len(s) <= k. The result is a
// function of s and k alone (a total order), whatever the algorithm; it is
// appended to dst[:0].
func TopK(dst []int32, s []float32, k int) []int32 {
	dst = dst[:0]
	if len(s) <= k {
		for j := range s {
			dst = append(dst, int32(j))
		}
		return dst
	}
	h := topHeap{s: s, idx: dst}
	for j := range s {
		if len(h.idx) < k {
			heap.Push(&h, int32(j))
		} else if h.better(int32(j), h.idx[0]) {
			h.idx[0] = int32(j)
			heap.Fix(&h, 0)
		}
	}
	slices.Sort(h.idx)
	return h.idx
}

// topHeap is a min-heap of positions under the ranking (worst on top).
type topHeap struct {
	s   []float32
	idx []int32
}

// better reports whether position a ranks above position b.
func (h *topHeap) better(a, b int32) bool {
	sa, sb := h.s[a], h.s[b]
	na, nb := sa != sa, sb != sb
	switch {
	case na != nb:
		return nb
	case !na && sa != sb:
		return sa > sb
	}
	return a < b
}

func (h *topHeap) Len() int           { return len(h.idx) }
func (h *topHeap) Less(i, j int) bool { return h.better(h.idx[j], h.idx[i]) }
func (h *topHeap) Swap(i, j int)      { h.idx[i], h.idx[j] = h.idx[j], h.idx[i] }
func (h *topHeap) Push(v any)         { h.idx = append(h.idx, v.(int32)) }
func (h *topHeap) Pop() any {
	v := h.idx[len(h.idx)-1]
	h.idx = h.idx[:len(h.idx)-1]
	return v
}

// IndexInput is the indexer's part of one sequence's step of n tokens.
type IndexInput struct {
	Q []float32 // n × Indexer.Heads × Indexer.HeadDim
	W []float32 // n × Indexer.Heads: head weights
	K []float32 // n × Indexer.HeadDim: the new tokens' keys (quantized by the kernel)
}

func dsaCheckIndex(d kernelspec.DSA, ix *IndexInput, n, keys int) error {
	x := d.Indexer
	switch {
	case len(ix.Q) != n*x.Heads*x.HeadDim:
		return invalidf("dsa: len(index Q) %d, want %d (%d tokens × %d heads × %d)", len(ix.Q), n*x.Heads*x.HeadDim, n, x.Heads, x.HeadDim)
	case len(ix.W) != n*x.Heads:
		return invalidf("dsa: len(index W) %d, want %d (%d tokens × %d heads)", len(ix.W), n*x.Heads, n, x.Heads)
	case len(ix.K) != keys*x.HeadDim:
		return invalidf("dsa: len(index K) %d, want %d (%d tokens × %d)", len(ix.K), keys*x.HeadDim, keys, x.HeadDim)
	}
	return nil
}

// DSA writes the new tokens' latent rows into lat and indexer key rows
// into idx, then for each query token p: scores every cached position
// 0..p with the indexer (reading idx in logical order), selects TopK
// positions (TopK's order; all of them when p+1 <= TopK) and runs MLA over
// the selected positions in ascending order (see kernelspec.MLA for the formulas).
// When sel is not nil, sel[i] receives query i's selected positions
// (appended to sel[i][:0]); len(sel) must then be n. Errors wrap kernelspec.ErrInvalid.
func DSA(d kernelspec.DSA, lat, idx Paged, w *MLAWeights, in MLAInput, ix IndexInput, out []float32, sel [][]int32) error {
	if err := d.Indexer.Validate(); err != nil {
		return err
	}
	m := d.MLA
	n, err := mlaCheck(m, w, &in, out, false)
	if err != nil {
		return err
	}
	if err := dsaCheckIndex(d, &ix, n, n); err != nil {
		return err
	}
	if sel != nil && len(sel) != n {
		return invalidf("dsa: len(sel) %d, want %d tokens", len(sel), n)
	}
	if n == 0 {
		return nil
	}
	stride, err := lat.check("dsa latent", m.RowBytes(), 0, in.Pos+n)
	if err != nil {
		return err
	}
	x := d.Indexer
	ib := x.RowBytes()
	istride, err := idx.check("dsa index key", ib, 0, in.Pos+n)
	if err != nil {
		return err
	}
	mlaWrite(m, lat, stride, &in, n)
	for i := 0; i < n; i++ {
		indexStoreKey(x, idx.rowAt(istride, ib, in.Pos+i), ix.K[i*x.HeadDim:(i+1)*x.HeadDim])
	}
	if sel == nil {
		sel = make([][]int32, n)
	}
	ctx := in.Pos + n
	parallelFor(n, n*ctx*x.Heads*x.HeadDim, func() []float32 { return make([]float32, ctx+x.HeadDim) }, func(scratch []float32, i int) {
		scores, key := scratch[:ctx], scratch[ctx:]
		p := in.Pos + i
		if p+1 <= x.TopK {
			sel[i] = TopK(sel[i], scores[:p+1], x.TopK) // all of them; scores unused
			return
		}
		q := ix.Q[i*x.Heads*x.HeadDim : (i+1)*x.Heads*x.HeadDim]
		hw := ix.W[i*x.Heads : (i+1)*x.Heads]
		for j := 0; j <= p; {
			base, cnt := idx.span(istride, j, p+1)
			for t := 0; t < cnt; t++ {
				row := base[t*istride : t*istride+ib]
				if x.Plain {
					decodeRow(x.Keys, key, row)
					scores[j+t] = indexPlainScore(x, q, hw, key)
				} else {
					scores[j+t] = indexScore(x, q, hw, row)
				}
			}
			j += cnt
		}
		sel[i] = TopK(sel[i], scores[:p+1], x.TopK)
	})
	mlaAttend(m, lat, stride, w, in.Pos, n, mlaRotateQ(m, in.Pos, in.QPE), in.QNope, sel, out)
	return nil
}

// DenseDSA is the dense reference of DSA: in.CKV, in.KPE and ix.K
// hold every position 0..Pos+n-1 (raw: it rotates, rounds and quantizes them
// as the cache would), the queries are the n tokens at Pos..Pos+n-1. Top-k
// here sorts all candidates (score descending, then position ascending),
// independently of TopK's heap. sel as in DSA. Bit-identical to DSA.
func DenseDSA(d kernelspec.DSA, w *MLAWeights, in MLAInput, ix IndexInput, out []float32, sel [][]int32) error {
	if err := d.Indexer.Validate(); err != nil {
		return err
	}
	m, x := d.MLA, d.Indexer
	n, err := mlaCheck(m, w, &in, out, true)
	if err != nil {
		return err
	}
	if err := dsaCheckIndex(d, &ix, n, in.Pos+n); err != nil {
		return err
	}
	if sel != nil && len(sel) != n {
		return invalidf("dsa: len(sel) %d, want %d tokens", len(sel), n)
	}
	c, kpe := mlaDenseLatents(m, in)
	qpe := mlaRotateQ(m, in.Pos, in.QPE)
	T, D := in.Pos+n, x.HeadDim
	codes := make([]float32, T*D)
	scales := make([]float32, T)
	row := make([]byte, x.RowBytes())
	for t := 0; t < T; t++ {
		if x.Plain {
			indexStoreKey(x, row, ix.K[t*D:(t+1)*D])
			decodeRow(x.Keys, codes[t*D:(t+1)*D], row)
			continue
		}
		QuantizeIndexKey(row, ix.K[t*D:(t+1)*D])
		cd, sc := DequantizeIndexKey(row, D)
		copy(codes[t*D:], cd)
		scales[t] = sc
	}
	for i := 0; i < n; i++ {
		p := in.Pos + i
		cand := make([]int32, p+1)
		score := make([]float32, p+1)
		for s := 0; s <= p; s++ {
			cand[s] = int32(s)
			if x.Plain {
				score[s] = indexPlainScore(x, ix.Q[i*x.Heads*D:(i+1)*x.Heads*D], ix.W[i*x.Heads:(i+1)*x.Heads], codes[s*D:(s+1)*D])
				continue
			}
			var acc float32
			for h := 0; h < x.Heads; h++ {
				dot := Dot(ix.Q[(i*x.Heads+h)*D:][:D], codes[s*D:][:D])
				acc += float32(ix.W[i*x.Heads+h] * relu(dot))
			}
			score[s] = acc * scales[s]
		}
		slices.SortFunc(cand, func(a, b int32) int {
			sa, sb := score[a], score[b]
			if na, nb := sa != sa, sb != sb; na != nb {
				if na {
					return 1
				}
				return -1
			} else if !na && sa != sb {
				if sa > sb {
					return -1
				}
				return 1
			}
			return int(a - b)
		})
		if len(cand) > x.TopK {
			cand = cand[:x.TopK]
		}
		slices.Sort(cand)
		if sel != nil {
			sel[i] = append(sel[i][:0], cand...)
		}
		for h := 0; h < m.Heads; h++ {
			mlaDenseOne(m, w, c, kpe, h, in.QNope[(i*m.Heads+h)*m.QKNopeHeadDim:][:m.QKNopeHeadDim],
				qpe[(i*m.Heads+h)*m.QKRopeHeadDim:][:m.QKRopeHeadDim], cand, out[(i*m.Heads+h)*m.VHeadDim:][:m.VHeadDim])
		}
	}
	return nil
}
