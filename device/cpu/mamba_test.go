package cpu_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Prefix reuse of a hybrid model: the first request's steps save snapshots
// (Item.Snapshots) at every 8th token, later requests start from a snapshot
// copied into their live slot (a Grant copy) at Pos > 0, and every request
// still equals the dense reference. Live slots are reused after release, so
// a new sequence's state must start from zero.
func TestMambaSnapshotsAndPrefixReuse(t *testing.T) {
	// Eight layers, so that both stages of PP 2 hold mamba and attention
	// layers (a stage without attention turns prefix reuse off).
	m := synthModel(t, "nemotron-3-nano-30b-a3b", model.SyntheticSpec{Layers: 8}, "bf16")
	for _, l := range m.Layers {
		t.Logf("layer %d: %s %s", l.Index, l.Mixer, l.FFN)
	}
	ref, err := cpu.NewReference(m, seed, backends["gqa"].Kernel)
	if err != nil {
		t.Fatal(err)
	}
	for _, pp := range []int{1, 2} {
		t.Run(fmt.Sprintf("pp=%d", pp), func(t *testing.T) {
			r := newRig(t, m, opts{backend: "gqa", manager: "mamba", pp: pp, reuse: true, snaps: kvcache.SnapshotConfig{Interval: 8}})
			base := prompt(30, 5, m.Vocab)
			a := &req{seq: 1, prompt: base, chunk: 7, want: 3}
			r.run([]*req{a})
			other := append(append([]int32(nil), base[:20]...), prompt(10, 6, m.Vocab)...)
			b := &req{seq: 2, prompt: other, chunk: 5, want: 4}
			c := &req{seq: 3, prompt: base, want: 4}
			d := &req{seq: 4, prompt: prompt(17, 7, m.Vocab), chunk: 3, want: 4} // shares nothing
			r.run([]*req{b, c, d})
			for s, mg := range r.mgrs {
				st, err := mg.Stats(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if s == 0 && st.Snapshots.Taken == 0 {
					t.Errorf("stage %d took no snapshot", s)
				}
			}
			if b.reused == 0 || c.reused == 0 {
				t.Fatalf("reused %d and %d tokens: want > 0 (snapshots were not taken or not found)", b.reused, c.reused)
			}
			t.Logf("reused: b %d, c %d, d %d", b.reused, c.reused, d.reused)
			checkReference(t, ref, []*req{a, b, c, d})
		})
	}
}

// Live state slots are reused after release (two slots, six requests in
// three rounds): a sequence at Pos 0 must start from zeroed state, not from
// what the slot's previous owner left.
func TestMambaSlotReuse(t *testing.T) {
	m := synthModel(t, "nemotron-3-nano-30b-a3b", model.SyntheticSpec{}, "bf16")
	ref, err := cpu.NewReference(m, seed, backends["gqa"].Kernel)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, m, opts{backend: "gqa", manager: "mamba", batch: 2})
	var all []*req
	for round := range 3 {
		reqs := []*req{
			{seq: kvcache.SeqID(100 + 2*round), prompt: prompt(11, 20+round, m.Vocab), chunk: 4, want: 3},
			{seq: kvcache.SeqID(101 + 2*round), prompt: prompt(6, 30+round, m.Vocab), want: 3},
		}
		r.run(reqs)
		all = append(all, reqs...)
	}
	if got := r.layouts[0].MaxSequences; got > 4 {
		t.Fatalf("MaxSequences %d: want few live slots so that they are reused", got)
	}
	checkReference(t, ref, all)
}
