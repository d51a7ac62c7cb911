package cpu_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device/hf/hftest"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestCheckpointMTPDrafts checks a DeepSeek checkpoint's MTP layer against
// a recomputation: with one draft per step and whole prompts, every MTP
// cache row pairs a position's hidden state with the true next token, so
// the draft a sequence gets after each step must equal, bit for bit, the
// draft a fresh sequence of the same tokens gets from one prefill (whose
// MTP layer computes every row anew). The MTP weights are random, so their
// own drafts are almost never accepted; a second run feeds the true next
// token as each step's draft instead, so that every step keeps two rows
// and the MTP cache grows by two. A wrong MTP layer index, position or
// kept row in the MTP cache changes the drafts; the verified tokens,
// which are the main model's, cannot show it.
func TestCheckpointMTPDrafts(t *testing.T) {
	skipUnderRace(t)
	for _, c := range [][2]string{{"deepseek_v3", "v1"}, {"deepseek_v32", "v2"}} {
		fam, mgr := c[0], c[1]
		dir := filepath.Join(t.TempDir(), fam+"_mtp")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := hftest.WriteMTP(goldenDir(fam), dir, hftest.MTPSpec{Layers: 1, Seed: 41}); err != nil {
			t.Fatal(err)
		}
		m := checkpointModel(t, dir, "float32")
		ps, _, err := hftest.ReadGolden(goldenDir(fam))
		if err != nil {
			t.Fatal(err)
		}
		t.Run(fam+"/"+mgr, func(t *testing.T) {
			o := opts{backend: backendOf(m), manager: mgr, drafts: 1, kv: "float32"}
			type seen struct {
				out   []int32 // the sequence's tokens after a step
				draft int32   // the draft proposed after them
			}
			var hist []seen
			truth := map[kvcache.SeqID][]int32{}
			accepted := map[bool]int{}
			for _, forced := range []bool{false, true} {
				r := newRig(t, m, o)
				var reqs []*req
				for i, p := range ps[:6] {
					reqs = append(reqs, &req{seq: kvcache.SeqID(10 + i), prompt: p.PromptIDs, want: p.MaxTokens})
				}
				last := map[kvcache.SeqID]int{} // tokens out when last recorded
				r.after = func(r *rig) {
					for _, q := range reqs {
						if len(q.out) <= last[q.seq] || len(q.drafts) != 1 {
							continue
						}
						hist = append(hist, seen{slices.Concat(q.prompt, q.out), q.drafts[0]})
						last[q.seq] = len(q.out)
						if tr := truth[q.seq]; forced && len(q.out) < len(tr) {
							q.drafts = []int32{tr[len(q.out)]}
						}
					}
				}
				r.run(reqs)
				for _, q := range reqs {
					accepted[forced] += q.accepted
					if !forced {
						truth[q.seq] = q.out
					} else if tr := truth[q.seq]; len(q.out) < len(tr) || !slices.Equal(q.out[:len(tr)], tr) {
						t.Errorf("seq %d with the true drafts: tokens %v, with the MTP layer's %v", q.seq, q.out, truth[q.seq])
					}
				}
			}
			// Each recorded state again, fresh: prefill all but its last
			// token, which the step samples, then the draft.
			fresh := newRig(t, m, o)
			var checks []*req
			for i, h := range hist {
				checks = append(checks, &req{seq: kvcache.SeqID(1000 + i), prompt: h.out[:len(h.out)-1], want: 1})
			}
			for i := 0; i < len(checks); i += 4 {
				fresh.run(checks[i:min(i+4, len(checks))])
			}
			bad := 0
			for i, h := range hist {
				c := checks[i]
				if c.out[0] != h.out[len(h.out)-1] || len(c.drafts) != 1 || c.drafts[0] != h.draft {
					bad++
					if bad <= 3 {
						t.Errorf("after %d tokens: token %d, draft %v; the running sequence had token %d, draft %d",
							len(h.out), c.out[0], c.drafts, h.out[len(h.out)-1], h.draft)
					}
				}
			}
			t.Logf("%d drafts checked; accepted: %d of the MTP layer's, %d of the true ones", len(hist), accepted[false], accepted[true])
			if bad > 0 || len(hist) < 40 || accepted[true] < 30 {
				t.Errorf("%d of %d drafts differ from a fresh prefill's; %d true drafts accepted: want none to differ, 40 or more checked, 30 or more accepted",
					bad, len(hist), accepted[true])
			}
		})
	}
}
