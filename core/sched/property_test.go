package sched

import (
	"math/rand/v2"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestRunToCompletion drives random configurations and request streams
// through the scheduler and the fake cache, with up to pp micro-batches in
// flight, random accepted drafts and random aborts, and checks that:
//   - every request finishes with exactly MaxNew tokens, or is rejected, or
//     was aborted;
//   - the fake cache is never over-committed and its ledger stays sound
//     (every item starts at the ledger's history and reserves what it writes);
//   - no request is in two in-flight micro-batches, and no in-flight request
//     is released;
//   - an empty step with nothing in flight means the scheduler is idle;
//   - everything ends within a step bound, also when the cache denies asks
//     it should grant (fault injection);
//   - a cache that keeps its MaxSeqTokens promise never sees a request
//     rejected for not fitting in an empty cache.
func TestRunToCompletion(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tpb := rapid.SampledFrom([]int{1, 2, 4, 8, 16}).Draw(t, "tpb")
		draft := rapid.IntRange(0, 3).Draw(t, "draft")
		batch := rapid.IntRange(1, 6).Draw(t, "batch")
		pp := rapid.IntRange(1, 3).Draw(t, "pp")
		blocks := rapid.IntRange(2, 40).Draw(t, "blocks")
		cfg := Config{
			MaxBatchSize:   batch,
			MaxResident:    batch * pp,
			MaxNumTokens:   rapid.IntRange(max(tpb, 1+draft), max(tpb, 1+draft, 96)).Draw(t, "maxNumTokens"),
			ChunkedPrefill: rapid.Bool().Draw(t, "chunked"),
			TokensPerBlock: tpb,
			Draft:          draft,
			Reuse:          rapid.Bool().Draw(t, "reuse"),
			Policy:         rapid.SampledFrom([]Policy{GuaranteedNoEvict, MaxUtilization}).Draw(t, "policy"),
		}
		// Usually the cache keeps its promise (MaxSeqTokens fits in the pool);
		// sometimes it over-promises and the empty-cache rejection must act.
		honest := rapid.IntRange(0, 4).Draw(t, "honest") > 0
		if honest {
			blocks = max(blocks, (2+draft+tpb-1)/tpb)
			cfg.MaxSeqTokens = blocks * tpb
		} else {
			cfg.MaxSeqTokens = rapid.IntRange(2+draft, 3*blocks*tpb+2+draft).Draw(t, "maxSeqTokens")
		}
		cfg.MaxSeqLen = rapid.IntRange(2, max(2, cfg.MaxSeqTokens-draft, 8)).Draw(t, "maxSeqLen")
		// The longest request that passes every up-front check.
		fit := min(cfg.MaxSeqLen, cfg.MaxSeqTokens-draft)
		d, err := newDriver(cfg, blocks)
		if err != nil {
			t.Fatalf("New(%+v): %v", cfg, err)
		}
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
		d.acceptDrafts = func(it Item) int { return rng.IntN(it.Draft + 1) }

		n := rapid.IntRange(1, 16).Draw(t, "requests")
		arrivals := map[int][]Request{}
		spread := rapid.SampledFrom([]int{0, 5, 40}).Draw(t, "spread")
		last, work := 0, 0
		for i := range n {
			var r Request
			if fit >= 2 && rapid.IntRange(0, 9).Draw(t, "valid") > 0 {
				maxPrompt := fit - 1
				if !cfg.ChunkedPrefill {
					maxPrompt = min(maxPrompt, cfg.MaxNumTokens)
				}
				r.Prompt = rapid.IntRange(1, maxPrompt).Draw(t, "prompt")
				r.MaxNew = rapid.IntRange(1, min(24, fit-r.Prompt)).Draw(t, "maxNew")
			} else {
				r.Prompt = rapid.IntRange(0, 2*fit).Draw(t, "prompt")
				r.MaxNew = rapid.IntRange(0, 24).Draw(t, "maxNew")
			}
			r.ID = kvcache.SeqID(i + 1)
			at := rapid.IntRange(0, spread).Draw(t, "arrival")
			arrivals[at] = append(arrivals[at], r)
			last = max(last, at)
			work += r.Prompt + r.MaxNew + 1
			if cfg.Reuse {
				d.f.lookup[r.ID] = rapid.IntRange(0, r.Prompt).Draw(t, "hit") / tpb * tpb
			}
		}
		abortProb := rapid.SampledFrom([]float64{0, 0, 0.02, 0.1}).Draw(t, "abortProb")
		// Fault injection: the cache denies an ask it should grant (a held
		// request's step under GUARANTEED_NO_EVICT included).
		denyProb := rapid.SampledFrom([]float64{0, 0, 0.05, 0.2}).Draw(t, "denyProb")

		bound := last + 1 + 8*pp*(work+n) + 100
		for step := 0; ; step++ {
			if step > bound {
				t.Fatalf("no termination after %d steps (cfg %+v): waiting %d running %d in flight %d",
					step, cfg, d.s.Waiting(), d.s.Running(), d.s.InFlight())
			}
			for _, r := range arrivals[step] {
				d.add(r)
			}
			if abortProb > 0 && rng.Float64() < abortProb {
				d.abort(kvcache.SeqID(1 + rng.IntN(n)))
			}
			if denyProb > 0 && rng.Float64() < denyProb {
				d.f.deny[kvcache.SeqID(1+rng.IntN(n))] = 1
			}
			if step > last && d.s.Idle() {
				if len(d.queue) != 0 {
					t.Fatalf("idle with %d micro-batches in flight", len(d.queue))
				}
				break
			}
			st := d.schedule()
			if len(st.Items) == 0 && d.s.InFlight() == 0 && !d.s.Idle() {
				d.errorf("empty step, nothing in flight, not idle: waiting %d running %d", d.s.Waiting(), d.s.Running())
			}
			// Keep up to pp micro-batches in flight; sometimes finish early.
			if len(d.queue) >= pp || (len(st.Items) == 0 && len(d.queue) > 0) || rng.IntN(4) == 0 {
				d.completeOldest()
			}
			d.f.check()
			if len(d.errs) > 0 || len(d.f.violations) > 0 {
				t.Fatalf("cfg %+v\nerrors:\n%s\nviolations:\n%s", cfg,
					strings.Join(d.errs, "\n"), strings.Join(d.f.violations, "\n"))
			}
		}
		d.checkDone()
		for id, m := range d.reqs {
			if honest && denyProb == 0 && strings.HasPrefix(m.rejected, "does not fit") {
				d.errorf("request %d rejected although the cache keeps its promise: %s", id, m.rejected)
			}
		}
		if len(d.errs) > 0 || len(d.f.violations) > 0 {
			t.Fatalf("cfg %+v\nerrors:\n%s\nviolations:\n%s", cfg,
				strings.Join(d.errs, "\n"), strings.Join(d.f.violations, "\n"))
		}
	})
}
