package equiv_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/serve"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/workload"
)

// forkN is the n of every request of the forked equivalence.
const forkN = 4

// liveChoices runs the workload of sets on a live engine, each request as
// forkN seeded sampled choices (serve.ChoiceDecodings: choice i samples with
// seed + i), through SubmitN when together, else each choice through
// Submit alone; it returns every choice's tokens and logprobs, by request
// then choice, and the engine's count of forked sequences.
func liveChoices(t *testing.T, sets []string, together bool) ([][]int32, [][]float64, int64) {
	t.Helper()
	cfg, _, err := config.Load(builtin.Registry(), nil, nil, append([]string{"isolation=inprocess", "plugin_dirs=" + binDir}, sets...))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	res, err := setup.Resolve(cfg, "equiv", true)
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	reqs := res.Spec.Workload.Requests
	l := setup.NewLauncher(cfg, builtin.Registry(), nil)
	defer l.Close()
	lv, err := engine.StartLive(context.Background(), res.Spec, l)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	var hs []*engine.Handle
	for _, r := range reqs {
		lr := engine.LiveRequest{Prompt: r.Prompt, MaxTokens: r.OutputLen}
		decs := serve.ChoiceDecodings(workload.Decoding{Sampling: sampledParams(r.ID), Logprobs: true}, forkN)
		if together {
			got, err := lv.SubmitN(lr, decs)
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, got...)
			continue
		}
		for _, d := range decs {
			lr.Decoding = d
			h, err := lv.Submit(lr)
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
	}
	toks := make([][]int32, len(hs))
	lps := make([][]float64, len(hs))
	var wg sync.WaitGroup
	errs := make([]error, len(hs))
	for i, h := range hs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for {
				ev, err := h.Next(ctx)
				if err == nil {
					err = ev.Err
				}
				if err != nil {
					errs[i] = err
					return
				}
				toks[i] = append(toks[i], ev.Tokens...)
				lps[i] = append(lps[i], ev.Logprobs...)
				if ev.Done {
					return
				}
			}
		})
	}
	wg.Wait()
	forked := lv.Stats().Forked
	rep, err := lv.Stop()
	if err != nil || rep.Invariants.Violations != 0 {
		t.Fatalf("stop: %v; violations %d: %v", err, rep.Invariants.Violations, rep.Invariants.First)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("choice %d: %v", i, err)
		}
	}
	return toks, lps, forked
}

// choicesDigest is one digest of every choice's tokens and logprobs.
func choicesDigest(toks [][]int32, lps [][]float64) string {
	h := sha256.New()
	for i := range toks {
		for _, x := range toks[i] {
			_ = binary.Write(h, binary.LittleEndian, x)
		}
		for _, x := range lps[i] {
			_ = binary.Write(h, binary.LittleEndian, math.Float64bits(x))
		}
		h.Write([]byte{0xff})
	}
	return fmt.Sprintf("%x", h.Sum(nil)[:8])
}

// TestForkedEquivalence: every request of the suite's workload as n = 4
// seeded sampled choices, submitted together so the engine prefills the
// prompt once and forks its sequence on every stage, gives one digest of
// the choices' tokens and logprobs through every manager of the family
// (v1, v2; v1 and mamba on the hybrid), both isolation modes, reuse on and
// off, chunk sizes 1, 7, 64 and max_num_tokens, PP 1 and 2, a cache so
// small that choices are preempted and recomputed, and a host tier; and
// that digest is the one of the same choices submitted one by one (no
// fork). Every variant forked.
func TestForkedEquivalence(t *testing.T) {
	for _, f := range []family{families[0], families[3]} {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel() // the families share nothing: each its own runs and reference
			base := slices.Concat(common, f.sets, variants(f)[0].sets)
			alone, alps, forked := liveChoices(t, base, false)
			if forked != 0 {
				t.Errorf("choices submitted one by one: %d sequences forked", forked)
			}
			want := choicesDigest(alone, alps)
			distinct := false
			for i := 1; i < forkN; i++ {
				distinct = distinct || !slices.Equal(alone[0], alone[i])
			}
			if !distinct {
				t.Errorf("the %d choices of request 0 are all %v: seeds seed+i should differ", forkN, alone[0])
			}
			for _, v := range variants(f) {
				sets := slices.Concat(common, f.sets, v.sets)
				toks, lps, forked := liveChoices(t, sets, true)
				if forked == 0 {
					t.Errorf("%s: no sequence forked", v.name)
				}
				if got := choicesDigest(toks, lps); got != want {
					for i := range toks {
						if !slices.Equal(toks[i], alone[i]) {
							t.Errorf("%s (sets %s): digest %s, want %s: choice %d (request %d, choice %d): %v, alone %v",
								v.name, strings.Join(sets, " "), got, want, i, i/forkN, i%forkN, toks[i], alone[i])
							break
						}
					}
					continue
				}
				t.Logf("%s: digest %s, %d sequences forked", v.name, want, forked)
			}
		})
	}
}
