package kernel

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/internal/race"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"pgregory.net/rapid"
)

type gqaInputs struct {
	q, k, v []float32 // all T tokens
}

func newGQAInputs(r *rand.Rand, g kernelspec.GQA, T int) gqaInputs {
	return gqaInputs{
		q: randVec(r, T*g.Heads*g.HeadDim, 2),
		k: randVec(r, T*g.KVHeads*g.HeadDim, 1),
		v: randVec(r, T*g.KVHeads*g.HeadDim, 1),
	}
}

// runGQAPaged runs the sequence through kv in the given chunks and returns
// every token's output.
func runGQAPaged(t tb, g kernelspec.GQA, kv Paged, in gqaInputs, chunks []int) []float32 {
	t.Helper()
	qw, kw := g.Heads*g.HeadDim, g.KVHeads*g.HeadDim
	T := len(in.q) / qw
	out := make([]float32, T*qw)
	pos := 0
	for _, n := range chunks {
		if err := GQA(g, kv, pos, in.q[pos*qw:(pos+n)*qw], in.k[pos*kw:(pos+n)*kw], in.v[pos*kw:(pos+n)*kw], out[pos*qw:(pos+n)*qw]); err != nil {
			t.Fatalf("Forward(pos %d, n %d): %v", pos, n, err)
		}
		pos += n
	}
	return out
}

func drawGQA(t *rapid.T) kernelspec.GQA {
	kvh := rapid.IntRange(1, 3).Draw(t, "kvHeads")
	g := kernelspec.GQA{
		KVHeads: kvh,
		Heads:   kvh * rapid.IntRange(1, 3).Draw(t, "group"),
		HeadDim: rapid.IntRange(1, 9).Draw(t, "headDim"),
		Dtype:   drawDtype(t),
	}
	if rapid.Bool().Draw(t, "windowed") {
		g.Window = rapid.IntRange(1, 12).Draw(t, "window")
	}
	g.RoPE = drawRoPE(t, g.HeadDim)
	return g
}

// TestGQAPagedEqualsDenseProperty: any layout (block size, physical
// permutation, offset, stride), any chunk split and GOMAXPROCS 1 or 2 give
// the dense reference's bits.
func TestGQAPagedEqualsDenseProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		g := drawGQA(rt)
		T := rapid.IntRange(1, 70).Draw(rt, "T")
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 1))
		in := newGQAInputs(r, g, T)
		want := make([]float32, len(in.q))
		if err := DenseGQA(g, 0, in.q, in.k, in.v, want); err != nil {
			rt.Fatalf("DenseGQA: %v", err)
		}
		l := drawLayout(rt, T)
		chunks := drawChunks(rt, T)
		procs := rapid.IntRange(1, 2).Draw(rt, "procs")
		var got []float32
		withProcs(procs, func() { got = runGQAPaged(rt, g, newPaged(r, l, g.RowBytes()), in, chunks) })
		checkEqual(rt, "paged vs dense", got, want)
	})
}

// TestGQADenseSuffix: the dense reference of a suffix of queries equals the
// tail of the full one (so a caller may check one decode step alone).
func TestGQADenseSuffix(t *testing.T) {
	g := kernelspec.GQA{Heads: 4, KVHeads: 2, HeadDim: 8, Window: 5, Dtype: kernelspec.BF16, RoPE: kernelspec.RoPE{Dim: 8, Theta: 10000}}
	r := rand.New(rand.NewPCG(7, 7))
	in := newGQAInputs(r, g, 20)
	qw := g.Heads * g.HeadDim
	full := make([]float32, len(in.q))
	if err := DenseGQA(g, 0, in.q, in.k, in.v, full); err != nil {
		t.Fatal(err)
	}
	tail := make([]float32, 3*qw)
	if err := DenseGQA(g, 17, in.q[17*qw:], in.k, in.v, tail); err != nil {
		t.Fatal(err)
	}
	checkEqual(t, "DenseGQA(pos 17)", tail, full[17*qw:])
}

// TestGQAChunkAndPlacementInvariance compares two paged runs bit for bit,
// one chunk of 64 against 64 chunks of 1, block size 16 contiguous against
// block size 3 shuffled, GOMAXPROCS 1 against 2 (parallel path forced).
func TestGQAChunkAndPlacementInvariance(t *testing.T) {
	for _, g := range []kernelspec.GQA{
		{Heads: 8, KVHeads: 2, HeadDim: 16, Dtype: kernelspec.BF16, RoPE: kernelspec.RoPE{Dim: 16, Theta: 10000}},
		{Heads: 4, KVHeads: 4, HeadDim: 12, Window: 9, Dtype: kernelspec.FP8},
	} {
		r := rand.New(rand.NewPCG(11, 12))
		const T = 64
		in := newGQAInputs(r, g, T)
		var a, b []float32
		withProcs(1, func() {
			a = runGQAPaged(t, g, newPaged(r, layout{tpb: 16, perm: seq(4)}, g.RowBytes()), in, []int{T})
		})
		ones := make([]int, T)
		for i := range ones {
			ones[i] = 1
		}
		perm := r.Perm(22)
		withProcs(2, func() {
			b = runGQAPaged(t, g, newPaged(r, layout{tpb: 3, perm: perm, offset: 5, pad: 2}, g.RowBytes()), in, ones)
		})
		checkEqual(t, "64×1 shuffled tpb 3, 2 procs vs 1×64 tpb 16, 1 proc", b, a)
	}
}

// TestGQAStaleBlockDetected: a table that points one block at a stale block
// (another sequence's, or the same sequence's before its last write) gives a
// different output, so an equivalence suite can catch a wrong block table.
func TestGQAStaleBlockDetected(t *testing.T) {
	g := kernelspec.GQA{Heads: 4, KVHeads: 2, HeadDim: 8, Dtype: kernelspec.BF16}
	r := rand.New(rand.NewPCG(13, 14))
	const T, tpb = 24, 4
	in := newGQAInputs(r, g, T)
	other := newGQAInputs(r, g, T)
	// Blocks 0..5 hold this sequence, 6..11 another sequence.
	kv := newPaged(r, layout{tpb: tpb, perm: seq(12)}, g.RowBytes())
	kv.Table = kv.Table[:6]
	good := runGQAPaged(t, g, kv, in, []int{T})
	otherKV := kv
	otherKV.Table = []kvcache.BlockID{6, 7, 8, 9, 10, 11}
	runGQAPaged(t, g, otherKV, other, []int{T})

	qw := g.Heads * g.HeadDim
	last := func(tab []kvcache.BlockID) []float32 {
		v := kv
		v.Table = tab
		out := make([]float32, qw)
		// Re-run the last token only: it rewrites its own row (in block 5) and reads the rest.
		if err := GQA(g, v, T-1, in.q[(T-1)*qw:], in.k[(T-1)*g.KVHeads*g.HeadDim:], in.v[(T-1)*g.KVHeads*g.HeadDim:], out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	checkEqual(t, "re-run with the right table", last(kv.Table), good[(T-1)*qw:])
	for b := 0; b < 5; b++ {
		tab := append([]kvcache.BlockID(nil), kv.Table...)
		tab[b] = kvcache.BlockID(6 + b)
		if sameBits(last(tab), good[(T-1)*qw:]) < 0 {
			t.Errorf("table[%d] -> stale block %d: output unchanged, want different", b, 6+b)
		}
	}
}

func TestGQAErrors(t *testing.T) {
	g := kernelspec.GQA{Heads: 4, KVHeads: 2, HeadDim: 8, Dtype: kernelspec.BF16}
	r := rand.New(rand.NewPCG(1, 1))
	kv := newPaged(r, layout{tpb: 4, perm: seq(2)}, g.RowBytes())
	q, k, out := make([]float32, 32), make([]float32, 16), make([]float32, 32)
	for _, tc := range []struct {
		name string
		g    kernelspec.GQA
		kv   func(Paged) Paged
		pos  int
		q    []float32
	}{
		{"heads", kernelspec.GQA{Heads: 3, KVHeads: 2, HeadDim: 8}, nil, 0, q},
		{"window", kernelspec.GQA{Heads: 4, KVHeads: 2, HeadDim: 8, Window: -1}, nil, 0, q},
		{"rope dim", kernelspec.GQA{Heads: 4, KVHeads: 2, HeadDim: 8, RoPE: kernelspec.RoPE{Dim: 10, Theta: 1}}, nil, 0, q},
		{"q length", g, nil, 0, q[:31]},
		{"pos", g, nil, -1, q},
		{"table short", g, nil, 8, q},
		{"block out of range", g, func(p Paged) Paged { p.Table = []kvcache.BlockID{0, 7}; return p }, 4, q},
		{"negative block", g, func(p Paged) Paged { p.Table = []kvcache.BlockID{-1, 0}; return p }, 0, q},
		{"stride", g, func(p Paged) Paged { p.Stride = 3; return p }, 0, q},
		{"row past block", g, func(p Paged) Paged { p.Offset = 10; return p }, 0, q},
		{"tpb", g, func(p Paged) Paged { p.TokensPerBlock = 0; return p }, 0, q},
	} {
		v := kv
		if tc.kv != nil {
			v = tc.kv(kv)
		}
		err := GQA(tc.g, v, tc.pos, tc.q, k, k, out)
		if !errors.Is(err, kernelspec.ErrInvalid) {
			t.Errorf("%s: Forward = %v, want kernelspec.ErrInvalid", tc.name, err)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	// A sliding window does not read (nor check) blocks wholly before it.
	gw := g
	gw.Window = 2
	v := kv
	v.Table = []kvcache.BlockID{-1, 1}
	if err := GQA(gw, v, 5, q, k, k, out); err != nil {
		t.Errorf("window 2 at pos 5 with table[0] = -1: %v, want nil", err)
	}
}

// TestGQADraftVerifyAndRewrite: an MTP verification step writes 1+2 tokens
// (two drafts, one wrong); after accepting one draft the next step rewrites
// the rejected draft's slot. Every output of the real sequence equals the
// dense reference over the real tokens, and the verify step's outputs for
// the accepted prefix equal it too.
func TestGQADraftVerifyAndRewrite(t *testing.T) {
	g := kernelspec.GQA{Heads: 4, KVHeads: 2, HeadDim: 8, Window: 6, Dtype: kernelspec.BF16, RoPE: kernelspec.RoPE{Dim: 8, Theta: 10000}}
	r := rand.New(rand.NewPCG(51, 52))
	const T = 16
	in := newGQAInputs(r, g, T)
	qw, kw := g.Heads*g.HeadDim, g.KVHeads*g.HeadDim
	want := make([]float32, T*qw)
	if err := DenseGQA(g, 0, in.q, in.k, in.v, want); err != nil {
		t.Fatal(err)
	}
	kv := newPaged(r, layout{tpb: 4, perm: []int{3, 0, 2, 1}}, g.RowBytes())
	got := make([]float32, T*qw)
	step := func(pos int, q, k, v, out []float32) {
		t.Helper()
		if err := GQA(g, kv, pos, q, k, v, out); err != nil {
			t.Fatal(err)
		}
	}
	step(0, in.q[:10*qw], in.k[:10*kw], in.v[:10*kw], got[:10*qw])
	// Verify: token 10 plus drafts 11 (right) and 12 (wrong).
	bad := newGQAInputs(r, g, 1)
	vq := append(append([]float32(nil), in.q[10*qw:12*qw]...), bad.q...)
	vk := append(append([]float32(nil), in.k[10*kw:12*kw]...), bad.k...)
	vv := append(append([]float32(nil), in.v[10*kw:12*kw]...), bad.v...)
	vout := make([]float32, 3*qw)
	step(10, vq, vk, vv, vout)
	checkEqual(t, "verify step, accepted prefix", vout[:2*qw], want[10*qw:12*qw])
	// Next steps start at 12 and overwrite the rejected draft's row.
	step(12, in.q[12*qw:], in.k[12*kw:], in.v[12*kw:], got[12*qw:])
	checkEqual(t, "after rewrite", got[12*qw:], want[12*qw:])
}

// TestLongContextRealDims: realistic head sizes, a few hundred tokens,
// the default parallel threshold (goroutines engage by themselves), decode
// after a large prefill chunk, against the dense references.
func TestLongContextRealDims(t *testing.T) {
	if race.Enabled {
		// Numerical at realistic sizes; the parallel loops it reaches
		// are the ones withProcs forces in the other kernel tests, which
		// the race pass runs.
		t.Skip("a numerical check at real sizes: run without -race (make test's main pass)")
	}
	r := rand.New(rand.NewPCG(61, 62))
	const T = 400
	g := kernelspec.GQA{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 300, Dtype: kernelspec.BF16, RoPE: kernelspec.RoPE{Dim: 64, Theta: 500000}}
	in := newGQAInputs(r, g, T)
	want := make([]float32, len(in.q))
	if err := DenseGQA(g, 0, in.q, in.k, in.v, want); err != nil {
		t.Fatal(err)
	}
	var got []float32
	withProcs(2, func() {
		parallelMin = 1 << 16 // the default: the chunk goes parallel, decode steps maybe not
		got = runGQAPaged(t, g, newPaged(r, layout{tpb: 32, perm: r.Perm(13)}, g.RowBytes()), in, []int{T - 3, 1, 1, 1})
	})
	checkEqual(t, "GQA long context", got, want)

	m := kernelspec.MLA{Heads: 8, KVLoraRank: 64, QKNopeHeadDim: 32, QKRopeHeadDim: 16, VHeadDim: 32, Dtype: kernelspec.FP8, RoPE: kernelspec.RoPE{Dim: 16, Theta: 10000, Interleaved: true}}
	x := kernelspec.Indexer{Heads: 4, HeadDim: 32, TopK: 64}
	c := newMLACase(r, m, x, T)
	din, dix := c.dense(0)
	wantM := make([]float32, T*m.Heads*m.VHeadDim)
	wantD := make([]float32, len(wantM))
	if err := DenseMLA(m, c.w, din, wantM); err != nil {
		t.Fatal(err)
	}
	if err := DenseDSA(kernelspec.DSA{MLA: m, Indexer: x}, c.w, din, dix, wantD, nil); err != nil {
		t.Fatal(err)
	}
	var gotM, gotD []float32
	withProcs(2, func() {
		parallelMin = 1 << 16
		gotM = runMLAPaged(t, c, newPaged(r, layout{tpb: 64, perm: r.Perm(7)}, m.RowBytes()), []int{T - 2, 1, 1})
		gotD, _ = runDSAPaged(t, c, newPaged(r, layout{tpb: 16, perm: r.Perm(25)}, m.RowBytes()), newPaged(r, layout{tpb: 8, perm: r.Perm(50)}, x.RowBytes()), []int{T - 2, 1, 1})
	})
	checkEqual(t, "MLA long context", gotM, wantM)
	checkEqual(t, "DSA long context", gotD, wantD)
}
