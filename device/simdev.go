package device

import (
	"context"
	"fmt"

	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// simDevice is the sim device: it allocates nothing, computes nothing, and
// returns the modelled time of each forward (package sim).
//
// Block copies are counted, not performed, as transfers: a transfer is a
// maximal run of consecutive copies of one list with the same source and
// destination pools whose source and destination blocks both go up by one
// (what a worker moves with one cudaMemcpyAsync of contiguous memory), and
// it costs sim.Env.CopySeconds of its bytes: one Hardware.CopyLatency plus
// the run's BlockBytes over PCIe when it crosses host and device (or stays
// on the host), or a device-memory read plus write when both pools are on
// the device. So N scattered blocks pay N latencies and a contiguous run of
// N pays one, which is what makes small blocks move far below the link's
// bandwidth. CopyBlocks queues that time and the next Forward adds it to its
// Nanos, together with the time of the batch's own Copies (a list of its
// own: a run does not span the two), because the copies run on the stage's
// device before its layers.
type simDevice struct {
	env     *sim.Env
	stage   *sim.Stage
	pools   map[int]simPool // by pool id
	pending float64         // seconds of copies queued by CopyBlocks

	// Scratch reused between forwards.
	step          sim.Step
	seqs, sampled []sim.Seq
}

type simPool struct {
	bytes  float64
	device bool
}

func openSim(s Stage) (Device, error) {
	cfg := s.Config
	m := cfg.Model // the Env keeps the dimensions, not the caller's layers
	m.Layers = nil
	env, err := sim.NewEnv(&m, cfg.Hardware, cfg.TensorParallel, cfg.WeightsDtype)
	if err != nil {
		return nil, err
	}
	d := &simDevice{env: env, pools: make(map[int]simPool, len(s.Pools))}
	for _, p := range s.Pools {
		dev := p.Tier != kvcache.TierHost
		if !dev && !(cfg.Hardware.PCIeBW > 0) {
			return nil, fmt.Errorf("hardware %q: pcie_bandwidth %g must be > 0 with host-tier pool %d (%s)", cfg.Hardware.Name, cfg.Hardware.PCIeBW, p.ID, p.Name)
		}
		d.pools[p.ID] = simPool{bytes: float64(p.BlockBytes), device: dev}
	}
	d.stage, err = sim.NewStage(sim.StageConfig{
		Env:         env,
		Layers:      s.Layers,
		Embed:       cfg.Stage == 0,
		Head:        cfg.Stage == cfg.Stages-1,
		DraftTokens: cfg.DraftTokens,
		Mixer:       s.Backend.MixerWork,
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (d *simDevice) Modelled() bool { return true }

// copySeconds is the time of copies, transfer by transfer (copyRun).
func (d *simDevice) copySeconds(copies []kvcache.Copy) float64 {
	var s float64
	for len(copies) > 0 {
		n := copyRun(copies)
		c := copies[0]
		src, dst := d.pools[c.SrcPool], d.pools[c.DstPool]
		s += d.env.CopySeconds(float64(n)*src.bytes, src.device && dst.device)
		copies = copies[n:]
	}
	return s
}

// copyRun returns the length of the transfer that starts copies: the
// longest prefix whose copies share SrcPool and DstPool and whose SrcBlock
// and DstBlock each go up by one from copy to copy. 0 for no copies.
func copyRun(copies []kvcache.Copy) int {
	if len(copies) == 0 {
		return 0
	}
	n := 1
	for ; n < len(copies); n++ {
		p, c := copies[n-1], copies[n]
		if c.SrcPool != p.SrcPool || c.DstPool != p.DstPool || c.SrcBlock != p.SrcBlock+1 || c.DstBlock != p.DstBlock+1 {
			break
		}
	}
	return n
}

func (d *simDevice) CopyBlocks(_ context.Context, copies []kvcache.Copy) error {
	d.pending += d.copySeconds(copies)
	return nil
}

func (d *simDevice) Forward(_ context.Context, b *worker.Batch, _ *Tables) (Pass, error) {
	secs := d.pending + d.copySeconds(b.Copies)
	d.pending = 0
	st := &d.step
	*st = sim.Step{}
	seqs, sampled := d.seqs[:0], d.sampled[:0]
	for i := range b.Items {
		it := &b.Items[i]
		n := len(it.Tokens)
		seqs = append(seqs, sim.Seq{Context: it.Pos + n, New: n})
		st.Tokens += n
		if it.Sample {
			st.Logits += 1 + it.Draft
			sampled = append(sampled, sim.Seq{Context: it.Pos + n + 1, New: 1})
		}
	}
	d.seqs, d.sampled = seqs, sampled
	st.Seqs = seqs
	st.Sampled = sim.Batch{Seqs: sampled, Tokens: len(sampled)}
	w := d.stage.Forward(st)
	*st = sim.Step{} // keep nothing of the batch
	return Pass{Nanos: nanos(secs + w.Seconds)}, nil
}
