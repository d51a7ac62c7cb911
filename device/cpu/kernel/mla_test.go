package kernel

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"pgregory.net/rapid"
)

type mlaCase struct {
	m  kernelspec.MLA
	w  *MLAWeights
	in MLAInput   // all T tokens: QNope, QPE, CKV, KPE
	ix IndexInput // all T tokens
	x  kernelspec.Indexer
}

func newMLACase(r *rand.Rand, m kernelspec.MLA, x kernelspec.Indexer, T int) mlaCase {
	H, R := m.Heads, m.KVLoraRank
	return mlaCase{
		m: m, x: x,
		w: &MLAWeights{UK: randVec(r, H*m.QKNopeHeadDim*R, 0.5), UV: randVec(r, H*m.VHeadDim*R, 0.5)},
		in: MLAInput{
			QNope: randVec(r, T*H*m.QKNopeHeadDim, 1),
			QPE:   randVec(r, T*H*m.QKRopeHeadDim, 1),
			CKV:   randVec(r, T*R, 1),
			KPE:   randVec(r, T*m.QKRopeHeadDim, 1),
		},
		ix: IndexInput{
			Q: randVec(r, T*x.Heads*x.HeadDim, 1),
			W: randVec(r, T*x.Heads, 1),
			K: randVec(r, T*x.HeadDim, 1),
		},
	}
}

// slice returns the step input for tokens [a, b).
func (c mlaCase) slice(a, b int) (MLAInput, IndexInput) {
	m, x := c.m, c.x
	H := m.Heads
	return MLAInput{
			Pos:   a,
			QNope: c.in.QNope[a*H*m.QKNopeHeadDim : b*H*m.QKNopeHeadDim],
			QPE:   c.in.QPE[a*H*m.QKRopeHeadDim : b*H*m.QKRopeHeadDim],
			CKV:   c.in.CKV[a*m.KVLoraRank : b*m.KVLoraRank],
			KPE:   c.in.KPE[a*m.QKRopeHeadDim : b*m.QKRopeHeadDim],
		}, IndexInput{
			Q: c.ix.Q[a*x.Heads*x.HeadDim : b*x.Heads*x.HeadDim],
			W: c.ix.W[a*x.Heads : b*x.Heads],
			K: c.ix.K[a*x.HeadDim : b*x.HeadDim],
		}
}

func (c mlaCase) tokens() int { return len(c.in.CKV) / c.m.KVLoraRank }

// dense returns the queries [pos, T) with every position's keys.
func (c mlaCase) dense(pos int) (MLAInput, IndexInput) {
	in, ix := c.slice(pos, c.tokens())
	in.CKV, in.KPE, ix.K = c.in.CKV, c.in.KPE, c.ix.K
	return in, ix
}

func runMLAPaged(t tb, c mlaCase, lat Paged, chunks []int) []float32 {
	t.Helper()
	ow := c.m.Heads * c.m.VHeadDim
	out := make([]float32, c.tokens()*ow)
	pos := 0
	for _, n := range chunks {
		in, _ := c.slice(pos, pos+n)
		if err := MLA(c.m, lat, c.w, in, out[pos*ow:(pos+n)*ow]); err != nil {
			t.Fatalf("MLA.Forward(pos %d, n %d): %v", pos, n, err)
		}
		pos += n
	}
	return out
}

func runDSAPaged(t tb, c mlaCase, lat, idx Paged, chunks []int) ([]float32, [][]int32) {
	t.Helper()
	d := kernelspec.DSA{MLA: c.m, Indexer: c.x}
	ow := c.m.Heads * c.m.VHeadDim
	out := make([]float32, c.tokens()*ow)
	sel := make([][]int32, c.tokens())
	pos := 0
	for _, n := range chunks {
		in, ix := c.slice(pos, pos+n)
		if err := DSA(d, lat, idx, c.w, in, ix, out[pos*ow:(pos+n)*ow], sel[pos:pos+n]); err != nil {
			t.Fatalf("DSA.Forward(pos %d, n %d): %v", pos, n, err)
		}
		pos += n
	}
	return out, sel
}

func drawMLA(t *rapid.T) kernelspec.MLA {
	m := kernelspec.MLA{
		Heads:         rapid.IntRange(1, 3).Draw(t, "heads"),
		KVLoraRank:    rapid.IntRange(1, 9).Draw(t, "rank"),
		QKNopeHeadDim: rapid.IntRange(1, 5).Draw(t, "nope"),
		QKRopeHeadDim: 2 * rapid.IntRange(0, 3).Draw(t, "ropeHalf"),
		VHeadDim:      rapid.IntRange(1, 5).Draw(t, "vdim"),
		Dtype:         drawDtype(t),
	}
	if m.QKRopeHeadDim > 0 && rapid.Bool().Draw(t, "rope") {
		m.RoPE = kernelspec.RoPE{Dim: m.QKRopeHeadDim, Theta: 10000, Interleaved: rapid.Bool().Draw(t, "interleaved")}
	}
	return m
}

func TestMLAPagedEqualsDenseProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := drawMLA(rt)
		T := rapid.IntRange(1, 30).Draw(rt, "T")
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 2))
		c := newMLACase(r, m, kernelspec.Indexer{Heads: 1, HeadDim: 1, TopK: 1}, T)
		pos := rapid.IntRange(0, T-1).Draw(rt, "densePos")
		in, _ := c.dense(pos)
		want := make([]float32, (T-pos)*m.Heads*m.VHeadDim)
		if err := DenseMLA(m, c.w, in, want); err != nil {
			rt.Fatalf("DenseMLA: %v", err)
		}
		l := drawLayout(rt, T)
		chunks := drawChunks(rt, T)
		var got []float32
		withProcs(rapid.IntRange(1, 2).Draw(rt, "procs"), func() {
			got = runMLAPaged(rt, c, newPaged(r, l, m.RowBytes()), chunks)
		})
		checkEqual(rt, "MLA paged vs dense", got[pos*m.Heads*m.VHeadDim:], want)
	})
}

func TestDSAPagedEqualsDenseProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := drawMLA(rt)
		x := kernelspec.Indexer{Heads: rapid.IntRange(1, 3).Draw(rt, "iheads"), HeadDim: rapid.IntRange(1, 8).Draw(rt, "idim"), TopK: rapid.IntRange(1, 12).Draw(rt, "topk")}
		if rapid.Bool().Draw(rt, "plain") { // transformers' layout: unquantized keys, a scale inside the ReLU
			x.Plain, x.Keys, x.Scale = true, drawDtype(rt), float32(rapid.Float64Range(0, 2).Draw(rt, "iscale"))
		}
		T := rapid.IntRange(1, 30).Draw(rt, "T")
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 3))
		c := newMLACase(r, m, x, T)
		if rapid.Bool().Draw(rt, "ties") { // repeated keys: equal scores, tie-break by position
			for i := range c.ix.K {
				c.ix.K[i] = c.ix.K[i%x.HeadDim]
			}
		}
		in, ix := c.dense(0)
		want := make([]float32, T*m.Heads*m.VHeadDim)
		wantSel := make([][]int32, T)
		if err := DenseDSA(kernelspec.DSA{MLA: m, Indexer: x}, c.w, in, ix, want, wantSel); err != nil {
			rt.Fatalf("DenseDSA: %v", err)
		}
		l := drawLayout(rt, T)
		li := l
		li.perm = slices.Clone(l.perm)
		rand.New(rand.NewPCG(1, 1)).Shuffle(len(li.perm), func(i, j int) { li.perm[i], li.perm[j] = li.perm[j], li.perm[i] })
		chunks := drawChunks(rt, T)
		var got []float32
		var sel [][]int32
		withProcs(rapid.IntRange(1, 2).Draw(rt, "procs"), func() {
			got, sel = runDSAPaged(rt, c, newPaged(r, l, m.RowBytes()), newPaged(r, li, x.RowBytes()), chunks)
		})
		for i := range sel {
			if !slices.Equal(sel[i], wantSel[i]) {
				rt.Fatalf("query %d: selected %v, dense %v", i, sel[i], wantSel[i])
			}
			if want := min(i+1, x.TopK); len(sel[i]) != want {
				rt.Fatalf("query %d: %d selected, want %d", i, len(sel[i]), want)
			}
		}
		checkEqual(rt, "DSA paged vs dense", got, want)
	})
}

// TestDSAWithLargeTopKIsMLA: when top-k covers the whole context, sparse
// MLA is dense MLA bit for bit.
func TestDSAWithLargeTopKIsMLA(t *testing.T) {
	m := kernelspec.MLA{Heads: 2, KVLoraRank: 16, QKNopeHeadDim: 8, QKRopeHeadDim: 4, VHeadDim: 8, Dtype: kernelspec.BF16, RoPE: kernelspec.RoPE{Dim: 4, Theta: 10000}}
	x := kernelspec.Indexer{Heads: 2, HeadDim: 8, TopK: 64}
	r := rand.New(rand.NewPCG(21, 22))
	c := newMLACase(r, m, x, 40)
	l := layout{tpb: 8, perm: seq(5)}
	a := runMLAPaged(t, c, newPaged(r, l, m.RowBytes()), []int{17, 23})
	b, _ := runDSAPaged(t, c, newPaged(r, l, m.RowBytes()), newPaged(r, l, x.RowBytes()), []int{1, 39})
	checkEqual(t, "DSA(top-k 64) vs kernelspec.MLA", b, a)
}

func TestTopKTieBreak(t *testing.T) {
	for _, tc := range []struct {
		s    []float32
		k    int
		want []int32
	}{
		{[]float32{1, 3, 3, 2, 3}, 2, []int32{1, 2}},
		{[]float32{1, 3, 3, 2, 3}, 3, []int32{1, 2, 4}},
		{[]float32{5, 5, 5, 5}, 2, []int32{0, 1}},
		{[]float32{0, 0, 9, 0}, 1, []int32{2}},
		{[]float32{nanF(), 1, nanF(), 0}, 3, []int32{0, 1, 3}},
		{[]float32{2, 1}, 5, []int32{0, 1}},
	} {
		if got := TopK(nil, tc.s, tc.k); !slices.Equal(got, tc.want) {
			t.Errorf("TopK(%v, %d) = %v, want %v", tc.s, tc.k, got, tc.want)
		}
	}
}

func TestIndexKeyQuantization(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, k := range [][]float32{randVec(r, 16, 3), make([]float32, 16), {1e-6, -2e-6}, {448 * 1000, -1}} {
		row := make([]byte, len(k)+4)
		QuantizeIndexKey(row, k)
		codes, scale := DequantizeIndexKey(row, len(k))
		var amax float32
		for _, v := range k {
			amax = max(amax, float32(abs32(v)))
		}
		if want := max(amax, 1e-4) / FP8Max; scale != want {
			t.Errorf("scale = %g, want %g", scale, want)
		}
		for i, v := range k {
			if got := codes[i] * scale; abs32(got-v) > abs32(v)/16+scale/1024 {
				t.Errorf("k[%d] = %g, dequantized %g: beyond fp8 precision", i, v, got)
			}
		}
	}
}

// TestMLAStaleBlockDetected: one table entry pointing at a stale block
// changes the output.
func TestMLAStaleBlockDetected(t *testing.T) {
	m := kernelspec.MLA{Heads: 2, KVLoraRank: 8, QKNopeHeadDim: 4, QKRopeHeadDim: 2, VHeadDim: 4, Dtype: kernelspec.FP8}
	r := rand.New(rand.NewPCG(31, 32))
	c := newMLACase(r, m, kernelspec.Indexer{Heads: 1, HeadDim: 1, TopK: 1}, 12)
	lat := newPaged(r, layout{tpb: 4, perm: seq(4)}, m.RowBytes())
	lat.Table = lat.Table[:3]
	good := runMLAPaged(t, c, lat, []int{12})
	in, _ := c.slice(11, 12)
	for b := 0; b < 2; b++ {
		v := lat
		v.Table = []kvcache.BlockID{0, 1, 2}
		v.Table[b] = 3 // never written: garbage
		out := make([]float32, m.Heads*m.VHeadDim)
		if err := MLA(m, v, c.w, in, out); err != nil {
			t.Fatal(err)
		}
		if sameBits(out, good[11*m.Heads*m.VHeadDim:]) < 0 {
			t.Errorf("table[%d] -> stale block: output unchanged", b)
		}
	}
}

func TestMLAErrors(t *testing.T) {
	m := kernelspec.MLA{Heads: 2, KVLoraRank: 8, QKNopeHeadDim: 4, QKRopeHeadDim: 2, VHeadDim: 4, Dtype: kernelspec.BF16}
	r := rand.New(rand.NewPCG(1, 1))
	c := newMLACase(r, m, kernelspec.Indexer{Heads: 1, HeadDim: 4, TopK: 2}, 2)
	lat := newPaged(r, layout{tpb: 1, perm: seq(2)}, m.RowBytes())
	in, ix := c.slice(0, 2)
	out := make([]float32, 2*m.Heads*m.VHeadDim)
	bad := []struct {
		name string
		err  error
	}{
		{"rank", MLA(kernelspec.MLA{Heads: 1, QKNopeHeadDim: 1, VHeadDim: 1}, lat, c.w, in, out)},
		{"weights", MLA(m, lat, &MLAWeights{UK: c.w.UK[1:], UV: c.w.UV}, in, out)},
		{"nil weights", MLA(m, lat, nil, in, out)},
		{"out", MLA(m, lat, c.w, in, out[1:])},
		{"table", MLA(m, Paged{Data: lat.Data, BlockBytes: lat.BlockBytes, TokensPerBlock: 1, Table: lat.Table[:1]}, c.w, in, out)},
		{"rope dim", kernelspec.MLA{Heads: 2, KVLoraRank: 8, QKNopeHeadDim: 4, QKRopeHeadDim: 2, VHeadDim: 4, RoPE: kernelspec.RoPE{Dim: 4, Theta: 1}}.Validate()},
		{"topk", DSA(kernelspec.DSA{MLA: m, Indexer: kernelspec.Indexer{Heads: 1, HeadDim: 4}}, lat, lat, c.w, in, ix, out, nil)},
		{"index K", DSA(kernelspec.DSA{MLA: m, Indexer: c.x}, lat, lat, c.w, in, IndexInput{Q: ix.Q, W: ix.W}, out, nil)},
		{"sel", DSA(kernelspec.DSA{MLA: m, Indexer: c.x}, lat, lat, c.w, in, ix, out, make([][]int32, 1))},
	}
	for _, b := range bad {
		if !errors.Is(b.err, kernelspec.ErrInvalid) {
			t.Errorf("%s: %v, want kernelspec.ErrInvalid", b.name, b.err)
		} else {
			t.Logf("%s: %v", b.name, b.err)
		}
	}
}
