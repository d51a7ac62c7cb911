package cpu_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// The equivalence oracle has teeth: a block table that differs from the one
// the manager granted, or a stale Mamba state slot, changes the output.

// findItem returns the item of seq in b, or nil.
func findItem(b *worker.Batch, seq kvcache.SeqID) *worker.Item {
	for i := range b.Items {
		if b.Items[i].Seq == seq {
			return &b.Items[i]
		}
	}
	return nil
}

func TestWrongBlockTableIsCaught(t *testing.T) {
	skipUnderRace(t)
	for _, c := range []struct {
		preset, backend, manager string
	}{
		{"llama-3.1-8b", "gqa", "v2"},
		{"deepseek-v3.2", "dsa", "v1"},
		{"deepseek-v3.2", "mla", "v2"},
		{"nemotron-3-nano-30b-a3b", "gqa", "mamba"},
	} {
		t.Run(c.preset+"/"+c.backend+"/"+c.manager, func(t *testing.T) {
			m := synthModel(t, c.preset, model.SyntheticSpec{}, "bf16")
			ref, err := cpu.NewReference(m, seed, backends[c.backend].Kernel)
			if err != nil {
				t.Fatal(err)
			}
			r := newRig(t, m, opts{backend: c.backend, manager: c.manager})
			const victim = kvcache.SeqID(11)
			done := false
			// Once the victim decodes, swap the first two blocks of its
			// table in the first paged pool: a delta the manager never
			// granted, as a buggy manager or runtime would send.
			r.corrupt = func(stage int, b *worker.Batch) {
				it := findItem(b, victim)
				if done || it == nil || it.Pos < 12 {
					return
				}
				p := r.layouts[stage].Pools[0]
				tab := slices.Clone(r.ws[stage].Tables().Table(victim, 0))
				if p.TokensPerBlock == 0 || len(tab) < 2 {
					t.Fatalf("pool %d (%s): table %v: want a paged pool with 2+ blocks", p.ID, p.Name, tab)
				}
				tab[0], tab[1] = tab[1], tab[0]
				it.Tables = append([]kvcache.TableDelta{{Pool: p.ID, From: 0, Blocks: tab}}, it.Tables...)
				done = true
			}
			reqs := requests(m.Vocab, [3]int{9, 23, 30}, 5)
			r.run(reqs)
			if !done {
				t.Fatal("the corruption never ran")
			}
			msgs := mismatches(t, ref, reqs)
			if len(msgs) != 1 || !strings.HasPrefix(msgs[0], "seq 11 ") {
				t.Errorf("mismatches after swapping two blocks of seq %d: %q, want exactly seq %d's", victim, msgs, victim)
			}
		})
	}
}

func TestStaleStateSlotIsCaught(t *testing.T) {
	skipUnderRace(t)
	m := synthModel(t, "nemotron-3-nano-30b-a3b", model.SyntheticSpec{}, "bf16")
	ref, err := cpu.NewReference(m, seed, backends["gqa"].Kernel)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"swap", "unused"} {
		t.Run(mode, func(t *testing.T) {
			r := newRig(t, m, opts{backend: "gqa", manager: "mamba"})
			lay := r.layouts[0]
			ssm := len(lay.Pools) - 1
			if lay.Pools[ssm].TokensPerBlock != 0 {
				t.Fatalf("last pool %s is not the state pool", lay.Pools[ssm].Name)
			}
			a, b := kvcache.SeqID(10), kvcache.SeqID(11)
			done := false
			r.corrupt = func(stage int, bt *worker.Batch) {
				ia, ib := findItem(bt, a), findItem(bt, b)
				if done || ia == nil || ib == nil || ia.Pos < 3 || ib.Pos < 3 {
					return
				}
				id := lay.Pools[ssm].ID
				la := r.ws[stage].Tables().Table(a, ssm)[0]
				lb := r.ws[stage].Tables().Table(b, ssm)[0]
				if mode == "swap" {
					ia.Tables = append(ia.Tables, kvcache.TableDelta{Pool: id, From: 0, Blocks: []kvcache.BlockID{lb}})
					ib.Tables = append(ib.Tables, kvcache.TableDelta{Pool: id, From: 0, Blocks: []kvcache.BlockID{la}})
				} else {
					ia.Tables = append(ia.Tables, kvcache.TableDelta{Pool: id, From: 0, Blocks: []kvcache.BlockID{kvcache.BlockID(lay.Pools[ssm].Blocks - 1)}})
				}
				done = true
			}
			reqs := requests(m.Vocab, [3]int{9, 23, 30}, 5)
			r.run(reqs)
			if !done {
				t.Fatal("the corruption never ran")
			}
			msgs := mismatches(t, ref, reqs)
			want := 2
			if mode == "unused" {
				want = 1
			}
			if len(msgs) != want {
				t.Errorf("mismatches after a %s of live state slots: %q, want %d", mode, msgs, want)
			}
		})
	}
}
