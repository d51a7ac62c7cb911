package cpu_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// A sequence suspended to the host tier mid-generation (the manager's
// copies move its blocks to host pools, which the device allocates too) and
// resumed later onto other device blocks still equals the reference.
func TestSuspendResume(t *testing.T) {
	m := synthModel(t, "llama-3.1-8b", model.SyntheticSpec{}, "bf16")
	windowed(&m)
	ref, err := cpu.NewReference(m, seed, backends["gqa"].Kernel)
	if err != nil {
		t.Fatal(err)
	}
	for _, mgr := range []string{"v2"} { // cachemgr_v1 suspends nothing (its host tier serves reuse only)
		t.Run(mgr, func(t *testing.T) {
			r := newRig(t, m, opts{backend: "gqa", manager: mgr, host: 1 << 20})
			reqs := requests(m.Vocab, [3]int{9, 23, 30}, 6)
			victim := reqs[1]
			ctx := context.Background()
			moved := 0
			r.after = func(r *rig) {
				var call func(context.Context, []kvcache.SeqID) ([]bool, []kvcache.Copy, error)
				switch {
				case r.steps == 4 && !victim.done:
					victim.paused = true
				case r.steps == 7 && victim.paused:
					victim.paused = false
				default:
					return
				}
				for s, mg := range r.mgrs {
					call = mg.(kvcache.Suspender).Suspend
					if !victim.paused {
						call = mg.(kvcache.Suspender).Resume
					}
					ok, copies, err := call(ctx, []kvcache.SeqID{victim.seq})
					if errors.Is(err, kvcache.ErrUnsupported) {
						t.Skipf("manager %s has no host tier: %v", mgr, err)
					}
					if err != nil || !ok[0] {
						t.Fatalf("stage %d: suspend/resume = %v, %v", s, ok, err)
					}
					moved += len(copies)
					if err := r.ws[s].CopyBlocks(ctx, copies); err != nil {
						t.Fatal(err)
					}
				}
			}
			r.run(reqs)
			if moved == 0 {
				t.Fatal("suspend and resume moved no block")
			}
			checkReference(t, ref, reqs)
		})
	}
}
