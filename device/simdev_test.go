package device_test

import (
	"math"
	"testing"

	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestSimDeviceUsesCalibration: with Hardware.Calibration the sim worker's
// forward takes the calibrated time of its kernels (sim.Predict over what
// the stage records), and without one the datasheet roofline's, as before.
func TestSimDeviceUsesCalibration(t *testing.T) {
	cal := &spec.SimCalibration{
		Name: "test.json", LaunchSeconds: 2e-6, StepSeconds: 5e-4,
		Classes: []spec.KernelClassScale{
			{Class: "gemm", ComputeScale: 47, MemoryScale: 2.5},
			{Class: "mixer.gqa", ComputeScale: 3, MemoryScale: 4},
			{Class: "mixer.mamba", ComputeScale: 5, MemoryScale: 6},
		},
	}
	batch := func() worker.Batch {
		return worker.Batch{Step: 1, Items: []worker.Item{item(1, 0, 40, 0, true), item(2, 0, 1, 0, true)}}
	}
	c := config(0, 1)
	c.DraftTokens = 0
	plainW := configured(t, c)
	c.Hardware.Calibration = cal
	calW := configured(t, c)
	plain, err := plainW.Forward(ctx, batch())
	if err != nil {
		t.Fatal(err)
	}
	got, err := calW.Forward(ctx, batch())
	if err != nil {
		t.Fatal(err)
	}

	// The same stage on the datasheet roofline, recorded.
	m := smallModel()
	layers := m.Layers
	m.Layers = nil
	env, err := sim.NewEnv(&m, h200, 1, "bf16")
	if err != nil {
		t.Fatal(err)
	}
	st, err := sim.NewStage(sim.StageConfig{Env: env, Layers: layers, Embed: true, Head: true, Mixer: fake{}.MixerWork})
	if err != nil {
		t.Fatal(err)
	}
	step := &sim.Step{
		Batch:   sim.Batch{Seqs: []sim.Seq{{Context: 40, New: 40}, {Context: 1, New: 1}}, Tokens: 41},
		Logits:  2,
		Sampled: sim.Batch{Seqs: []sim.Seq{{Context: 41, New: 1}, {Context: 2, New: 1}}, Tokens: 2},
	}
	w, fs := st.Record(step)
	if want := int64(math.Round(w.Seconds * 1e9)); abs(plain.Nanos-want) > 1 {
		t.Errorf("uncalibrated forward = %d ns, want the datasheet stage's %d ns", plain.Nanos, want)
	}
	if want := int64(math.Round(sim.Predict(cal, fs) * 1e9)); abs(got.Nanos-want) > 1 {
		t.Errorf("calibrated forward = %d ns, want sim.Predict's %d ns", got.Nanos, want)
	}
	if got.Nanos < 2*plain.Nanos {
		t.Errorf("calibrated forward %d ns, datasheet %d ns: scales of 2.5 and more did not slow it down", got.Nanos, plain.Nanos)
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// copyNanos is what copies add to one forward of the sim worker configured
// with c: the same 4-token prefill with and without them, on fresh workers.
// queued copies go through CopyBlocks first, batch ones with the forward.
func copyNanos(t *testing.T, c worker.Config, queued, batch []kvcache.Copy) int64 {
	t.Helper()
	run := func(queued, batch []kvcache.Copy) int64 {
		w := configured(t, c)
		if err := w.CopyBlocks(ctx, queued); err != nil {
			t.Fatal(err)
		}
		it := item(1, 0, 4, 0, true)
		it.Tables = it.Tables[:1]
		res, err := w.Forward(ctx, worker.Batch{Step: 1, Items: []worker.Item{it}, Copies: batch})
		if err != nil {
			t.Fatal(err)
		}
		return res.Nanos
	}
	return run(queued, batch) - run(nil, nil)
}

// blocks returns n copies from pool src to pool dst: block srcAt+i*stride to
// dstAt+i*stride.
func blocks(n, src, dst, srcAt, dstAt, stride int) []kvcache.Copy {
	cs := make([]kvcache.Copy, n)
	for i := range cs {
		cs[i] = kvcache.Copy{SrcPool: src, SrcBlock: kvcache.BlockID(srcAt + i*stride), DstPool: dst, DstBlock: kvcache.BlockID(dstAt + i*stride)}
	}
	return cs
}

// TestSimCopiesAreTransfers: the sim worker charges a maximal run of copies
// with the same pools and consecutive source and destination blocks as one
// transfer (one copy latency plus the run's bytes), and anything else that
// breaks the run (a gap on either side, another pool, the end of a list)
// as another transfer.
func TestSimCopiesAreTransfers(t *testing.T) {
	c := config(0, 1)
	const n = 16
	bb := float64(c.Layout.Pools[0].BlockBytes) // full and host pools have the same block size
	if hb := float64(c.Layout.Pools[2].BlockBytes); hb != bb {
		t.Fatalf("fixture: host block bytes %g, device %g: want equal", hb, bb)
	}
	lat := h200.CopyLatency
	pcie := func(transfers int, blocks int) float64 {
		return float64(transfers)*lat + float64(blocks)*bb/h200.PCIeBW
	}
	d2d := func(transfers int, blocks int) float64 {
		return float64(transfers)*lat + float64(blocks)*2*bb/h200.MemBandwidth
	}
	scattered := make([]kvcache.Copy, 0, n)
	for i := range n { // consecutive on the device, every other block on the host
		scattered = append(scattered, kvcache.Copy{SrcPool: poolFull, SrcBlock: kvcache.BlockID(100 + i), DstPool: poolHost, DstBlock: kvcache.BlockID(2 * i)})
	}
	twoPools := append(blocks(n/2, poolFull, poolHost, 0, 0, 1), blocks(n/2, poolHost, poolFull, n/2, n/2, 1)...)
	for _, tc := range []struct {
		name          string
		queued, batch []kvcache.Copy
		want          float64
	}{
		{"contiguous run to the host", nil, blocks(n, poolFull, poolHost, 10, 20, 1), pcie(1, n)},
		{"contiguous run back, queued", blocks(n, poolHost, poolFull, 20, 10, 1), nil, pcie(1, n)},
		{"scattered blocks", nil, blocks(n, poolFull, poolHost, 0, 0, 3), pcie(n, n)},
		{"contiguous on one side only", nil, scattered, pcie(n, n)},
		{"two pool pairs", nil, twoPools, pcie(2, n)},
		{"a run split between queue and batch", blocks(n/2, poolFull, poolHost, 0, 0, 1), blocks(n/2, poolFull, poolHost, n/2, n/2, 1), pcie(2, n)},
		{"copy-on-write run on the device", nil, blocks(n, poolFull, poolFull, 0, 1000, 1), d2d(1, n)},
		{"scattered on the device", nil, blocks(n, poolFull, poolFull, 0, 1000, 2), d2d(n, n)},
	} {
		got := float64(copyNanos(t, c, tc.queued, tc.batch)) / 1e9
		if math.Abs(got-tc.want) > 2e-9 {
			t.Errorf("%s: copies add %g s, want %g s", tc.name, got, tc.want)
		}
	}
}

// TestSimCopyTimeGrowsWithTransfers: the same n blocks cost one latency
// more with every gap that splits them into one more transfer.
func TestSimCopyTimeGrowsWithTransfers(t *testing.T) {
	c := config(0, 1)
	const n = 12
	prev := int64(-1)
	for runs := 1; runs <= n; runs++ {
		// n blocks to the host in runs transfers: a gap on the host side
		// after every n/runs-th block (the rest in the last run).
		var cs []kvcache.Copy
		dst := 0
		for i := range n {
			if i > 0 && i%(n/runs) == 0 && i/(n/runs) < runs {
				dst++ // the gap
			}
			cs = append(cs, kvcache.Copy{SrcPool: poolFull, SrcBlock: kvcache.BlockID(i), DstPool: poolHost, DstBlock: kvcache.BlockID(dst)})
			dst++
		}
		got := copyNanos(t, c, nil, cs)
		if prev >= 0 {
			if d := float64(got-prev) / 1e9; math.Abs(d-h200.CopyLatency) > 2e-9 {
				t.Errorf("%d blocks in %d transfers cost %d ns, in %d: %d ns; want one copy latency (%g s) more", n, runs, got, runs-1, prev, h200.CopyLatency)
			}
		}
		prev = got
	}
}
