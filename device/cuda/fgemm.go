//go:build cuda && cgo

package cuda

// The fast matmul (dtype bfloat16; kernels/fgemm.cu): linear weights live
// on the device as bf16 rows padded with zeros to a stride of whole 64-value
// tiles, activations are rounded to bf16 on their way in, and every output
// is the in-order sum of float32 chains of tensor-core steps, one chain per
// 1024-wide part of k, whatever the number of rows or the kernel, so the
// result of a row does not depend on its batch.

import (
	"fmt"
	"strings"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
)

// fgemmPad is what a weight's row stride (tensor.ld) rounds its columns up
// to: a whole number of the k tiles the kernels step by (the skinny
// variants' 64-wide ones, and their last partial tile of a wider one; the
// tiled kernel's 32).
const fgemmPad = 64

// fgemmTiledRows is the fewest rows a tiled kernel takes; fewer go to the
// skinny kernels (decode and small prefills), which keep more warps
// streaming the weight. Both give the same bits (fgemm_test.go).
const fgemmTiledRows = 256

// tiledKernel is one of the kernels for many rows: kernels/fgemm.cu's
// kvx_fgemm_wide<bm>s<stages><s|g> (mma.sync: bm / 32 warps of 64 × 64,
// running sums in shared memory or in C) or sm90a/fgemm_wg.cu's
// kvx_fgemm_tma<bm>s<stages> (TMA and wgmma, warp-specialized: bm / 64
// computing warpgroups of 64 tokens × 128 features and a copying one;
// loaded only on a device of compute capability 9.0) and its split form
// kvx_fgemm_tmap<bm>s<stages> (a block a part, folded by kvx_fgemm_fold).
// Every tile is bm rows × 128 columns, and all give the same bits.
type tiledKernel struct {
	bm, threads, smem int  // rows a tile, threads and dynamic shared memory a block
	sm90a             bool // in ptx/sm90a: loaded on compute capability 9.0 only
	tma               bool // takes A's and W's tensor maps (bf16Map) first
	split             bool // one part a block (grid y), then kvx_fgemm_fold
	name              string
}

func wide(bm, stages int, totShared bool) tiledKernel {
	suffix := "g"
	smem := stages * (bm + tlBN) * tlBK * 2 // the ring
	if totShared {
		suffix = "s"
		smem += bm * tlBN * 4 // the running sums
	}
	return tiledKernel{bm, bm, smem, false, false, false, fmt.Sprintf("kvx_fgemm_wide%ds%d%s", bm, stages, suffix)}
}

// tmaTiled is kvx_fgemm_tma<64·cw>s<stages> (kvx_fgemm_tmap... when split):
// 64·cw tokens × 128 features a block, a ring of stages 64-wide k stages
// (and their two barriers each), 1 KiB for aligning it to the 128-byte
// swizzle's 1024-byte pattern.
func tmaTiled(cw, stages int, split bool) tiledKernel {
	bm := 64 * cw
	smem := stages*(bm+tlBN)*tmaBK*2 + 16*stages + 1024
	kind := "tma"
	if split {
		kind = "tmap"
	}
	return tiledKernel{bm, 128 * (cw + 1), smem, true, true, split, fmt.Sprintf("kvx_fgemm_%s%ds%d", kind, bm, stages)}
}

// The tile of every tiled kernel: bm × 128, k steps of 32 (the TMA
// kernels' stages are 64 wide: one 128-byte row).
const tlBN, tlBK, tmaBK = 128, 32, 64

// tiledVariants are every tiled kernel (the tests run each loaded one on
// every shape); tiled picks the one fgemm runs. scripts/wgemm-check.cu on
// the H200 at Llama-3-8B's prefill shapes (2048 × 6144 × 4096, 8192 ×
// 4096 × 4096, 8192 × 28672 × 4096, 8192 × 4096 × 14336; 20 iterations,
// 2026-12-03): tma128s4 552-623 TFLOP/s, tma128s6 494-558, wide256s3s
// 210-225; cuBLAS 689-769 in the same run. The split ones (tmap) are for
// tens of rows (tmapFor).
var tiledVariants = []tiledKernel{
	wide(128, 3, true), wide(256, 3, true), wide(128, 4, false), tmaTiled(2, 4, false), tmaTiled(2, 6, false),
	tmaTiled(2, 4, true), tmaTiled(1, 6, true), tmaTiled(1, 8, true),
}

var (
	tiledWide  = wide(256, 3, true)
	tiledWGMMA = tmaTiled(2, 4, false)
	tiledGLU   = tmaGLU()
)

// tmaGLU is kvx_fgemm_tma128s4g: tiledWGMMA over an MLP's gate and up
// weights with SwiGLU in its epilogue, a block's 128 weight rows 64
// features of each (pendingTiled).
func tmaGLU() tiledKernel {
	k := tmaTiled(2, 4, false)
	k.name += "g"
	return k
}

// loaded reports whether the device has kernel k (the sm90a ones only on
// compute capability 9.0).
func (g *gpu) loaded(k tiledKernel) bool {
	_, ok := g.fns[k.name]
	return ok
}

// tiled is the tiled kernel fgemm runs: the wgmma one where it is loaded.
func (g *gpu) tiled() tiledKernel {
	if g.loaded(tiledWGMMA) {
		return tiledWGMMA
	}
	return tiledWide
}

// fgemmPart is the k values of a part (FG_PART in kernels/fgemm.cu): every
// output is the sum, in part order, of one chain per part.
const fgemmPart = 1024

// skinnyKernel is one of kernels/fgemm.cu's skinny variants: m16 tiles,
// column warps and k slots a block, and how the warps are fed: the direct
// kernels (u > 0: kvx_fgemm_gemv*) load the weight straight into registers
// u 32-wide k blocks a chunk, the ring ones (kvx_fgemm_skinny*) through a
// cp.async ring of stages k tiles bk wide. The split ones (nw > 0:
// kvx_fgemm_split*) are ring kernels whose warps own nw n8 tiles each and
// whose blocks run one part each (no k slots), then kvx_fgemm_fold adds
// the parts. Its entry point's name is made once, not per call.
type skinnyKernel struct {
	mt, wc, wk, bk, stages, u, nw int
	name                          string
}

// gemvB is gemv's variant whose registers are bounded so that minb blocks
// fit an SM.
func gemvB(mt, wc, wk, u, minb int) skinnyKernel {
	k := gemv(mt, wc, wk, u)
	k.name += fmt.Sprintf("m%d", minb)
	return k
}

func skinny(mt, wc, wk, bk, stages int) skinnyKernel {
	return skinnyKernel{mt: mt, wc: wc, wk: wk, bk: bk, stages: stages, name: fmt.Sprintf("kvx_fgemm_skinny%dc%dk%db%ds%d", mt, wc, wk, bk, stages)}
}

func gemv(mt, wc, wk, u int) skinnyKernel {
	return skinnyKernel{mt: mt, wc: wc, wk: wk, u: u, name: fmt.Sprintf("kvx_fgemm_gemv%dc%dk%du%d", mt, wc, wk, u)}
}

// gemvx is gemv's variant with the exchanged loads (one 16-byte load a
// lane a k block, half of it traded with another lane).
func gemvx(k skinnyKernel) skinnyKernel {
	k.name = strings.Replace(k.name, "kvx_fgemm_gemv", "kvx_fgemm_gemvx", 1)
	return k
}

func split(mt, wc, nw, bk, stages int) skinnyKernel {
	return skinnyKernel{mt: mt, wc: wc, wk: 1, bk: bk, stages: stages, nw: nw,
		name: fmt.Sprintf("kvx_fgemm_split%dc%dn%db%ds%d", mt, wc, nw, bk, stages)}
}

// warps is the variant's warps a block.
func (k skinnyKernel) warps() int { return k.wc * k.wk }

// cols is the columns a block covers.
func (k skinnyKernel) cols() int { return 8 * k.wc * max(k.nw, 1) }

// smem is the variant's dynamic shared memory: a ring a k slot (ring
// kernels), and the other slots' partial sums.
func (k skinnyKernel) smem() int {
	return k.wk*k.stages*(16*k.mt+k.cols())*k.bk*2 + (k.wk-1)*k.mt*k.wc*32*4*4
}

// skinnyVariants are every skinny variant (the tests run each on every
// shape); skinnyFor picks one for a call.
var skinnyVariants = []skinnyKernel{
	gemv(1, 2, 4, 4), gemv(1, 2, 8, 4), gemv(1, 2, 4, 8), gemv(1, 1, 4, 8), gemv(1, 4, 4, 4), gemv(1, 4, 1, 8),
	gemv(2, 2, 4, 4), gemv(4, 4, 2, 4),
	skinny(1, 2, 4, 64, 4), skinny(2, 2, 4, 64, 4), skinny(2, 4, 2, 64, 4), skinny(4, 4, 2, 64, 4),
	split(4, 4, 4, 64, 4), split(4, 4, 2, 64, 4), split(4, 8, 2, 64, 4), split(4, 4, 1, 64, 4), split(2, 4, 2, 64, 4),
	split(4, 4, 4, 64, 3), split(4, 4, 2, 64, 3), split(4, 8, 2, 64, 3), split(2, 4, 2, 64, 3), split(2, 8, 2, 64, 3),
	gemvB(1, 2, 4, 4, 3), gemvB(1, 2, 4, 4, 4), gemvB(1, 2, 8, 4, 2), gemvB(1, 2, 4, 8, 3),
	gemvx(gemv(1, 2, 4, 4)), gemvx(gemv(1, 2, 8, 4)), gemvx(gemv(1, 1, 4, 8)), gemvx(gemv(1, 4, 4, 4)),
	gemvx(gemv(2, 2, 4, 4)), gemvx(gemvB(1, 2, 4, 4, 3)), gemvx(gemvB(1, 2, 4, 8, 3)),
}

// skinnyFor is the variant for n rows, m output columns (the widest weight
// of the launch) and a k range padded to ld. Every variant gives the same
// bits (parts folded in part order), so the choice is speed alone.
// BenchmarkFastSkinny on the H200 with the weights in k order (2026-12-03,
// 20x), GB/s at Llama-3-8B's decode shapes: q/k/v 6144 × 4096, o 4096 ×
// 4096, gate/up 28672 × 4096, down 4096 × 14336, the LM head 128256 × 4096:
//   - up to 4 rows (measured at 1), the direct kernel with the exchanged
//     loads, 1 column warp × 4 k slots × 8 unrolled blocks (4002 at the LM
//     head, 3116 at gate/up, 2176 at o; the plain loads 3074, 2415, 2144);
//     bounded to 3 blocks an SM, 2 column warps, for 4097–8192 columns
//     (2289 at q/k/v); from 8 parts, the split kernel, 2 m16 tiles × 4
//     column warps (2428 at down, the direct kernels 1637-2175);
//   - up to 16 rows (measured at 8), the ring kernel, 1 m16 tile × 2 column
//     warps × 4 k slots (2276 at q/k/v); where the split TMA kernel is not
//     loaded (tmapFor), the split kernel 2 × 4, 3 stages from 16384 columns
//     (2890 at gate/up), 4 stages from 8 parts (2391 at down);
//   - more rows, the split kernel where tmapFor declines (weights under
//     4096 columns, devices other than compute capability 9.0): 2 × 4 up to
//     32 rows (1592 at q/k/v), 2 × 8 with 3 stages from 16384 columns (2440
//     at gate/up); from 33 rows 4 m16 tiles × 4 column warps of 2 n8 tiles
//     (64 rows: 1224 at q/k/v); of 1 n8 tile up to 4096 columns (1103 at
//     o); 8 column warps and 3 stages from 16384 columns (1814 at gate/up);
//     3 stages from 8 parts (1500 at down).
//
// The other variants are kept for the tests and the benchmark.
func skinnyFor(n, m, ld int) skinnyKernel {
	parts := blocks(ld, fgemmPart)
	switch {
	case n <= 4 && parts >= 8:
		return split(2, 4, 2, 64, 4)
	case n <= 4 && m > 4096 && m <= 8192:
		return gemvx(gemvB(1, 2, 4, 4, 3))
	case n <= 4:
		return gemvx(gemv(1, 1, 4, 8))
	case n <= 16 && parts >= 8:
		return split(2, 4, 2, 64, 4)
	case n <= 16 && m >= 16384:
		return split(2, 4, 2, 64, 3)
	case n <= 16:
		return skinny(1, 2, 4, 64, 4)
	case n <= 32 && m >= 16384:
		return split(2, 8, 2, 64, 3)
	case n <= 32:
		return split(2, 4, 2, 64, 4)
	case m >= 16384:
		return split(4, 8, 2, 64, 3)
	case parts >= 8:
		return split(4, 4, 2, 64, 3)
	case m <= 4096:
		return split(4, 4, 1, 64, 4)
	}
	return split(4, 4, 2, 64, 4)
}

// tmapFor is the split TMA kernel (kvx_fgemm_tmap64s8: a block of 64 rows ×
// 128 columns a part, TMA and wgmma; compute capability 9.0) for n rows (up
// to fgemmTiledRows) of a weight of m columns, where it streams the weight
// faster than the skinny kernels. BenchmarkFastSkinny on the H200
// (2026-12-03, 20x), GB/s, the split TMA kernel against skinnyFor's choice:
// 8 rows (for 5-16 rows): 3085 / 2890 at gate/up, 2689 / 2391 at down, 2251
// / 2276 at q/k/v (so not there); 32 rows: 2829 / 2440 at gate/up, 2073 /
// 1592 at q/k/v; 64 rows: 2550 / 1814 at gate/up, 2562 (6 stages: 2603) /
// 1103 at o, 2351 / 1500 at down, 1936 / 1224 at q/k/v. Weights of fewer
// than 4096 columns make too few blocks (32 column tiles × the parts) and
// stay with the skinny kernel, which runs several weights in one launch.
func (g *gpu) tmapFor(n, m, ld int) (tiledKernel, bool) {
	k := tmaTiled(1, 8, true)
	switch {
	case n <= 4 || n >= fgemmTiledRows || m < 4096 || !g.loaded(k):
		return k, false
	case n <= 16 && m < 16384 && blocks(ld, fgemmPart) < 8:
		return k, false
	}
	return k, true
}

// streamKernel is sm90a/fgemm_wg.cu's kvx_fgemm_stream<nt>s<stages> (and
// kvx_fgemm_stream<nt>w<fw>s<stages>): the persistent kernel for up to nt
// rows (a multiple of 8 up to 64), wgmma with the weight as its A (64·fw
// features a unit, fw m64 blocks) and the rows as its B, a
// ring of stages 64-wide k stages running on across a block's units
// (feature tiles × parts), its parts folded by kvx_fgemm_fold. Loaded only
// on a device of compute capability 9.0.
type streamKernel struct {
	nt, fw, stages int
	name           string
}

func stream(nt, stages int) streamKernel {
	return streamKernel{nt, 1, stages, fmt.Sprintf("kvx_fgemm_stream%ds%d", nt, stages)}
}

func streamW(nt, fw, stages int) streamKernel {
	return streamKernel{nt, fw, stages, fmt.Sprintf("kvx_fgemm_stream%dw%ds%d", nt, fw, stages)}
}

// features is a unit's features.
func (k streamKernel) features() int { return 64 * k.fw }

// smem is the kernel's dynamic shared memory: the ring (64·fw feature rows
// and nt token rows of 128 bytes a stage), its two barriers a stage, and
// 1 KiB for aligning the ring to the swizzle's 1024-byte pattern.
func (k streamKernel) smem() int { return k.stages*(k.features()+k.nt)*tmaBK*2 + 16*k.stages + 1024 }

// streamThreads is a stream block: a computing warpgroup and a copying warp.
const streamThreads = 160

// streamVariants are every stream kernel (the tests run each loaded one
// against the skinny kernels, bit for bit); streamFor picks one for a call.
var streamVariants = []streamKernel{
	stream(8, 4), stream(8, 6), stream(8, 8), stream(8, 10), stream(16, 4), stream(16, 6), stream(32, 4), stream(32, 6),
	stream(64, 4), stream(64, 6), streamW(16, 2, 6), streamW(32, 2, 4), streamW(32, 2, 6), streamW(64, 2, 3), streamW(64, 2, 4),
}

// streamFor is the stream kernel for n rows and weights of up to m
// features, where it is loaded: the fewest token rows that hold n, and the
// stages that stream fastest. BenchmarkFastSkinny on the H200 (2026-12-04,
// 20x, with kvx_fgemm_fold), GB/s at Llama-3-8B's decode shapes (q/k/v
// 6144 × 4096, o 4096 × 4096, gate/up 28672 × 4096, down 4096 × 14336,
// the LM head 128256 × 4096), one run at 1 row and two at more:
//   - 1 row: 6 stages (4 blocks an SM) 3331, 2919, 3588, 3440 and 3631;
//     8 stages (3 blocks) 3266, 2777, 3718, 3190 and 4116 (so from 65536
//     features); 4 stages (6 blocks) 3301, 2881, 3799, 3288 and 3567; 24
//     stages (1 block) 1935, 1765, 2304, 2190 and 2476; the direct kernel
//     it replaces 1863-2404, 2541, 3139, 2166 and 3993;
//   - 8 rows: 6 stages 2801-2875 at q/k/v, 3260-3402 at gate/up,
//     3170-3276 at down; the ring and split kernels 1359-2265, 2065-2582,
//     1343-2398; the split TMA kernel 2184-2202, 2995-3058, 2652-2668;
//   - 32 rows: 32 token rows, 6 stages, 2599-2606 and 3080-3087 at q/k/v
//     and gate/up; 4 stages 2502-2546, 3050-3053; the split TMA kernel
//     2045-2091, 2780-2798;
//   - 64 rows: 4 stages 2239-2264, 2042-2075, 2646, 2234-2293; 6 stages
//     1920-1987, 2240-2253, 2704-2708, 2216-2443; the split TMA kernel
//     1886-1934, 2477-2484, 2516-2539, 2315-2327. Two m64 feature blocks a
//     unit (streamW: a stage's token rows read once for 128 features) gave
//     1866, 2238, 2519, 2322, and a Llama-3-8B decode step at batch 64 of
//     8.89 ms against 8.50 with 4 stages of one.
func (g *gpu) streamFor(n, m int) (streamKernel, bool) {
	var k streamKernel
	switch {
	case n <= 8 && m >= 65536:
		k = stream(8, 8)
	case n <= 8:
		k = stream(8, 6)
	case n <= 16:
		k = stream(16, 6)
	case n <= 32:
		k = stream(32, 6)
	case n <= 64:
		k = stream(64, 4)
	default:
		return k, false
	}
	_, ok := g.fns[k.name]
	return k, ok
}

// weightMap is a weight's tensor map for the stream kernel (boxes of 64 k
// × box features), made once per address and shape: a map is a function of
// the key alone, so an address a closed device freed and another weight of
// the same shape got again has the same map.
func (o *ops) weightMap(w cu.DevicePtr, rows, ld, box int) (tensorMap, error) {
	key := weightMapKey{w, rows, ld, box}
	if m, ok := o.g.wmaps[key]; ok {
		return m, nil
	}
	m, err := bf16Map(w, rows, ld, box)
	if err != nil {
		return m, err
	}
	if o.g.wmaps == nil {
		o.g.wmaps = map[weightMapKey]tensorMap{}
	}
	o.g.wmaps[key] = m
	return m, nil
}

type weightMapKey struct {
	w             cu.DevicePtr
	rows, ld, box int
}

// fgemmStream runs stream kernel k (n ≤ k.nt rows) over up to three
// weights; their parts are folded by o.fold.
func (o *ops) fgemmStream(a cu.DevicePtr, n, ld int, outs []gemmOut, k streamKernel) {
	if len(outs) == 0 || len(outs) > 3 || n > k.nt {
		panic(fmt.Sprintf("cuda: stream matmul %s of %d weights at %d rows", k.name, len(outs), n))
	}
	if o.err != nil {
		return
	}
	ma, err := bf16Map(a, n, ld, k.nt)
	if o.fail(err); o.err != nil {
		return
	}
	var maps [3]tensorMap
	var ms [3]int
	m, tiles := 0, 0
	for i := range 3 {
		g := gemmOut{w: outs[0].w} // an unused weight: no features
		if i < len(outs) {
			g = outs[i]
		}
		maps[i], err = o.weightMap(g.w, max(g.m, 1), ld, k.features())
		if o.fail(err); o.err != nil {
			return
		}
		ms[i] = g.m
		m += g.m
		tiles += blocks(g.m, k.features())
	}
	parts := blocks(ld, fgemmPart)
	p := o.scratch(int64(parts) * int64(n) * int64(m) * 4)
	o.fail(o.g.allowShared(k.name, k.smem()))
	per, err := o.g.residentBlocks(k.name, streamThreads, k.smem())
	if o.fail(err); o.err != nil {
		return
	}
	grid := min(o.g.sms*per, tiles*parts)
	o.run(k.name, dim{grid, 1, 1}, dim{streamThreads, 1, 1}, k.smem(), ma, maps[0], maps[1], maps[2], p, n, ms[0], ms[1], ms[2], ld)
	o.fold(p, parts, n, outs)
}

// pendingFold is a split matmul whose parts are not added yet: P holds
// parts × n × m float32 (n rows, m the columns of every output together,
// in outs' order). The first op that reads one of its outputs through
// cudaTensor runs the fold (kvx_fgemm_fold, every output at once); SwiGLU
// and AddRMSNorm read the parts themselves (kvx_fswiglu_fold,
// kvx_frmsnorm_fold), in the fold's order, so a decode step skips most fold launches
// (three of the four matmuls of a Llama layer) with the same bits.
//
// P is in the step's arena, which nothing reuses before reset: a fold is
// valid for the step (gen) that made it.
type pendingFold struct {
	o           *ops
	gen         uint64
	p           cu.DevicePtr
	parts, n, m int
	outs        []gemmOut
}

// fold adds P's parts into outs: later, at the first read, when every
// output is a tensor (fastMatMuls'); at once when one is bare memory (the
// kernel tests').
func (o *ops) fold(p cu.DevicePtr, parts, n int, outs []gemmOut) {
	f := &pendingFold{o: o, gen: o.ar.gen, p: p, parts: parts, n: n, outs: append([]gemmOut(nil), outs...)}
	later := true
	for _, g := range outs {
		f.m += g.m
		later = later && g.t != nil
	}
	if !later {
		f.run()
		return
	}
	for _, g := range outs {
		g.t.fold = f
	}
}

// run launches the fold into every output and marks them folded.
func (f *pendingFold) run() {
	for _, g := range f.outs {
		if g.t != nil && g.t.fold == f {
			g.t.fold = nil
		}
	}
	o := f.o
	if f.gen != o.ar.gen {
		panic(fmt.Sprintf("cuda: a matmul's parts folded after its step (arena generation %d, now %d)", f.gen, o.ar.gen))
	}
	args := []any{f.p, f.parts, f.n}
	for i := range 3 {
		var c cu.DevicePtr // an unused output: no columns
		m := 0
		if i < len(f.outs) {
			c, m = f.outs[i].c, f.outs[i].m
		}
		args = append(args, c, m)
	}
	g, b := flat(f.n * f.m)
	o.run("kvx_fgemm_fold", g, b, 0, args...)
}

// drop takes t out of f's outputs: an op has written t's values from the
// parts itself (kvx_rope_write_fold's q). A later fold skips its columns
// (kvx_fgemm_fold writes no output whose C is 0); col still counts them.
func (f *pendingFold) drop(t *tensor) {
	for i, g := range f.outs {
		if g.t == t {
			f.outs[i].c = 0
			t.fold = nil
			return
		}
	}
	panic("cuda: a tensor not among its fold's outputs")
}

// col is the first of t's columns among the launch's m.
func (f *pendingFold) col(t *tensor) int {
	c := 0
	for _, g := range f.outs {
		if g.t == t {
			return c
		}
		c += g.m
	}
	panic("cuda: a tensor not among its fold's outputs")
}

// bf16Weights reports whether a weight of rows × cols is kept as bf16 in
// fast mode: the matrices of linear layers (and embedding tables). Vectors
// (norm gains, biases) and narrow matrices (a Mamba2 conv's taps) stay
// float32: the kernels that read them take float32.
func bf16Weights(rows, cols int) bool { return rows >= 16 && cols >= 16 }

func padK(k int) int { return (k + fgemmPad - 1) / fgemmPad * fgemmPad }

var _ hf.BF16Loader = (*ops)(nil)

// WeightBF16 implements hf.BF16Loader: in fast mode a checkpoint's bf16
// linear weight goes to the device as it is in the file (padded there),
// with no float32 copy on the host.
func (o *ops) WeightBF16(raw []byte, rows, cols int) (synth.Tensor, bool) {
	if !o.fast || !bf16Weights(rows, cols) {
		return nil, false
	}
	if len(raw) != 2*rows*cols {
		panic(fmt.Sprintf("cuda: %d bytes for a %d × %d bf16 weight", len(raw), rows, cols))
	}
	t := &tensor{r: rows, c: cols, ld: padK(cols)}
	if o.err != nil {
		return t, true
	}
	h, err := o.g.alloc(int64(rows) * int64(t.ld) * 2)
	if err != nil {
		o.fail(err)
		return t, true
	}
	*o.weights = append(*o.weights, h)
	t.h = h
	if o.fail(o.stageBytes(raw)); o.err != nil {
		return t, true
	}
	g, b := flat(rows * t.ld)
	o.run("kvx_pad_bf16", g, b, 0, h, o.stage.p, rows, cols, t.ld)
	return t, true
}

// stageBytes copies raw into the staging buffer, grown as needed (after the
// kernels that read the old one are done).
func (o *ops) stageBytes(raw []byte) error {
	need := int64(len(raw))
	if o.stage.size < need {
		if o.stage.p != 0 {
			if err := o.g.sync(); err != nil {
				return err
			}
			cu.MemFree(o.stage.p)
		}
		o.stage.p, o.stage.size = 0, 0
		p, err := o.g.alloc(need)
		if err != nil {
			return err
		}
		o.stage.p, o.stage.size = p, need
	}
	return upload(o.stage.p, raw)
}

// weightBF16 makes t (rows × cols, allocated by Weight) a bf16 weight: data
// goes through a float32 staging buffer on the device and is rounded there
// (kvx_to_bf16), so the host does no per-element work.
func (o *ops) weightBF16(t *tensor, data []float32) {
	t.ld = padK(t.c)
	h, err := o.g.alloc(int64(t.r) * int64(t.ld) * 2)
	if err != nil {
		o.fail(err)
		return
	}
	*o.weights = append(*o.weights, h)
	t.h = h
	if o.fail(o.stageBytes(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(data))), 4*len(data)))); o.err != nil {
		return
	}
	g, b := flat(t.r * t.ld)
	o.run("kvx_to_bf16", g, b, 0, t.h, o.stage.p, t.r, t.c, t.ld)
}

// freeStage releases Weight's staging buffer (after loading). The caller
// must be on the context's goroutine.
func (o *ops) freeStage() {
	if o.stage.p != 0 {
		o.fail(o.g.sync())
		cu.MemFree(o.stage.p)
	}
	o.stage.p, o.stage.size = 0, 0
}

// f32 returns the address of t's float32 values: a bf16 weight read by a
// kernel that takes float32 (MLA's absorbed projections) gets a float32
// copy once, kept as long as the weights (the values are the bf16 ones,
// exactly).
func (o *ops) f32(t *tensor) cu.DevicePtr {
	if t.p != 0 || t.h == 0 || o.err != nil {
		return t.p
	}
	p, err := o.g.alloc(t.bytes())
	if err != nil {
		o.fail(err)
		return 0
	}
	*o.weights = append(*o.weights, p)
	g, b := flat(t.r * t.c)
	o.run("kvx_bf16_to_f32", g, b, 0, p, t.h, t.r, t.c, t.ld)
	t.p = p
	return p
}

// fastMatMul is MatMul with a bf16 weight: x rounded to bf16 (padded to
// the weight's stride), then the skinny or the tiled kernel.
func (o *ops) fastMatMul(xt, wt *tensor) *tensor {
	return o.fastMatMuls(xt, []*tensor{wt})[0]
}

// fastMatMuls is MatMuls with bf16 weights of one stride: x is rounded to
// bf16 once, and few rows run every weight in one skinny launch (up to
// three a launch).
func (o *ops) fastMatMuls(xt *tensor, ws []*tensor) []*tensor {
	n, k, ld := xt.r, xt.c, ws[0].ld
	// Gate and up, maybe: two weights of one shape for the tiled kernel
	// wait for their first reader (pendingTiled), unallocated.
	lazy := n >= fgemmTiledRows && len(ws) == 2 && ws[0].r == ws[1].r && o.g.loaded(tiledGLU)
	outs := make([]*tensor, len(ws))
	gs := make([]gemmOut, len(ws))
	for i, w := range ws {
		if w.ld != padK(k) || w.c != k {
			panic(fmt.Sprintf("cuda: fast MatMul: weight %d × %d (stride %d) for %d columns", w.r, w.c, w.ld, k))
		}
		if lazy {
			outs[i] = &tensor{r: n, c: w.r}
			continue
		}
		outs[i] = o.newTensor(n, w.r)
		gs[i] = gemmOut{outs[i].p, w.h, w.r, outs[i]}
	}
	if n == 0 {
		return outs
	}
	xa := xt.b // the bf16 copy the op that made x wrote, if it did
	if xa == 0 {
		xa = o.scratch(int64(n) * int64(ld) * 2)
		g, b := flat(n * ld)
		o.run("kvx_to_bf16", g, b, 0, xa, xt.p, n, k, ld)
	}
	if lazy {
		l := &pendingTiled{o: o, gen: o.ar.gen, a: xa, n: n, ld: ld, outs: [2]*tensor{outs[0], outs[1]}, ws: [2]*tensor{ws[0], ws[1]}}
		outs[0].lazy, outs[1].lazy = l, l
		return outs
	}
	o.fgemm(xa, n, ld, gs)
	return outs
}

// pendingTiled is a tiled fast matmul of two weights of one shape (an MLP's
// gate and up, through MatMuls) not launched yet: its first reader decides
// how it runs. SwiGLU of its two outputs, in that order, runs tiledGLU,
// SwiGLU in the matmul's epilogue, so neither output is written: at
// Llama-3-8B's size each token saves writing and reading back 2 × 14336
// float32. Any other read of either launches the tiled kernel for both
// (run), into outputs allocated then. A (bf16, in the step's arena) and the
// weights do not change within a step, so the launch is valid for the step
// (gen) that deferred it, whenever it runs; the bits are the same either
// way (TestFusedGLU).
type pendingTiled struct {
	o     *ops
	gen   uint64
	a     cu.DevicePtr
	n, ld int
	outs  [2]*tensor
	ws    [2]*tensor
}

// check panics when the launch is read after its step.
func (l *pendingTiled) check() {
	if l.gen != l.o.ar.gen {
		panic(fmt.Sprintf("cuda: a deferred matmul read after its step (arena generation %d, now %d)", l.gen, l.o.ar.gen))
	}
}

// run launches the tiled kernel for both outputs, which stop being lazy.
func (l *pendingTiled) run() {
	l.check()
	o := l.o
	for i, t := range l.outs {
		t.lazy = nil
		if o.err != nil {
			continue
		}
		p, err := o.ar.alloc(t.bytes())
		if o.fail(err); o.err != nil {
			continue
		}
		t.p = p
		o.fgemmTiled(p, l.a, l.ws[i].h, l.n, t.c, l.ld, o.g.tiled())
	}
}

// swiGLU returns SwiGLU(gate, up) through tiledGLU when gate and up are
// l's outputs in that order (nil when they are not): out and its bf16
// copy, rows padded to the fast matmul's stride, as kvx_fswiglu writes
// them. gate and up stay lazy: a later read of either runs l.
func (l *pendingTiled) swiGLU(gate, up *tensor) *tensor {
	if gate.lazy != l || up.lazy != l || l.outs[0] != gate || l.outs[1] != up {
		return nil
	}
	l.check()
	o, k := l.o, tiledGLU
	n, m := l.n, gate.c
	out := o.newTensor(n, m)
	ldo := padK(m)
	out.b = o.scratch(int64(n) * int64(ldo) * 2)
	ma, err := bf16Map(l.a, n, l.ld, k.bm)
	if o.fail(err); o.err != nil {
		return out
	}
	var mw [2]tensorMap
	for i, w := range l.ws {
		mw[i], err = o.weightMap(w.h, m, l.ld, tlBN/2)
		if o.fail(err); o.err != nil {
			return out
		}
	}
	grid := dim{blocks(n, k.bm) * blocks(m, tlBN/2), 1, 1}
	o.runShared(k.name, grid, dim{k.threads, 1, 1}, k.smem, ma, mw[0], mw[1], out.p, out.b, n, m, l.ld, ldo)
	return out
}

// gemmOut is one weight of a fast matmul: C (n × m float32) = A · Wᵀ; t is
// C's tensor when there is one (a split launch's fold then waits for the
// first read: pendingFold).
type gemmOut struct {
	c, w cu.DevicePtr
	m    int
	t    *tensor
}

// fgemm launches C = A (n × ld bf16) · Wᵀ for every weight of outs: the
// tiled kernel for each when n is large; up to 64 rows the stream kernel
// where it is loaded, up to three weights a launch; else the split TMA
// kernel for each weight tmapFor takes and the skinny one for the rest, up
// to three weights a launch.
func (o *ops) fgemm(a cu.DevicePtr, n, ld int, outs []gemmOut) {
	if n >= fgemmTiledRows {
		for _, g := range outs {
			o.fgemmTiled(g.c, a, g.w, n, g.m, ld, o.g.tiled())
		}
		return
	}
	if _, ok := o.g.streamFor(n, 0); ok {
		for len(outs) > 0 {
			take := min(3, len(outs))
			m := 0
			for _, g := range outs[:take] {
				m = max(m, g.m)
			}
			k, _ := o.g.streamFor(n, m)
			o.fgemmStream(a, n, ld, outs[:take], k)
			outs = outs[take:]
		}
		return
	}
	var rest []gemmOut // the weights tmapFor declines
	m := 0
	for _, g := range outs {
		if k, ok := o.g.tmapFor(n, g.m, ld); ok {
			o.fgemmTiled(g.c, a, g.w, n, g.m, ld, k)
			continue
		}
		rest = append(rest, g)
		m = max(m, g.m)
	}
	outs = rest
	k := skinnyFor(n, m, ld)
	for len(outs) > 0 {
		take := min(3, len(outs))
		o.fgemmSkinny(a, n, ld, outs[:take], k)
		outs = outs[take:]
	}
}

// skinnyTile is the m16 tiles a skinny block takes for n rows.
func skinnyTile(n int) int {
	switch {
	case n <= 16:
		return 1
	case n <= 32:
		return 2
	}
	return 4
}

// fgemmSkinny runs skinny kernel k (any of skinnyVariants, whatever n) over
// up to three weights.
func (o *ops) fgemmSkinny(a cu.DevicePtr, n, ld int, outs []gemmOut, k skinnyKernel) {
	if len(outs) == 0 || len(outs) > 3 {
		panic(fmt.Sprintf("cuda: skinny matmul of %d weights", len(outs)))
	}
	args := []any{a, n, ld}
	m := 0
	for i := range 3 {
		g := gemmOut{w: outs[0].w} // an unused weight: no columns
		if i < len(outs) {
			g = outs[i]
		}
		args = append(args, g.c, g.w, g.m)
		m += g.m
	}
	if k.nw == 0 {
		o.runShared(k.name, dim{blocks(n, 16*k.mt), blocks(m, k.cols()), 1}, dim{32 * k.warps(), 1, 1}, k.smem(), args...)
		return
	}
	parts := blocks(ld, fgemmPart)
	p := o.scratch(int64(parts) * int64(n) * int64(m) * 4)
	o.runShared(k.name, dim{blocks(n, 16*k.mt), blocks(m, k.cols()), parts}, dim{32 * k.warps(), 1, 1}, k.smem(), append(args, p)...)
	o.fold(p, parts, n, outs)
}

// fgemmTiled runs tiled kernel k (any of tiledVariants, any n).
func (o *ops) fgemmTiled(c, a, w cu.DevicePtr, n, m, ld int, k tiledKernel) {
	grid, block := dim{blocks(n, k.bm) * blocks(m, tlBN), 1, 1}, dim{k.threads, 1, 1}
	if !k.tma {
		o.runShared(k.name, grid, block, k.smem, c, a, w, n, m, ld)
		return
	}
	ma, err := bf16Map(a, n, ld, k.bm)
	if o.fail(err); o.err != nil {
		return
	}
	mw, err := bf16Map(w, m, ld, tlBN)
	if o.fail(err); o.err != nil {
		return
	}
	if !k.split {
		o.runShared(k.name, grid, block, k.smem, ma, mw, c, n, m, ld)
		return
	}
	parts := blocks(ld, fgemmPart)
	p := o.scratch(int64(parts) * int64(n) * int64(m) * 4)
	grid.y = parts
	o.runShared(k.name, grid, block, k.smem, ma, mw, p, n, m, ld)
	g, b := flat(n * m)
	o.run("kvx_fgemm_fold", g, b, 0, p, parts, n, c, m, c, 0, c, 0)
}
