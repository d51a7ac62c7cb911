package calibrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// The measurement design (calibDesign) is derived from the config's limits,
// so a config file sizes it: N = max_batch_size sequences, S = max_seq_len,
// T = max_num_tokens.
//
//   - The N sequences climb a ladder of contexts S/4, S/2 and S minus the
//     decode headroom. Each climb is prefill: chunks of T, T/2, T/4 and T/8
//     tokens (sequence i uses the i-th length, cyclically), packed several
//     sequences to a forward while they fit in T tokens, so prefill points
//     differ in chunk length, in context and in sequences per forward.
//   - At each rung: decode steps of the first b sequences for b in 1, 2,
//     N/4, N/2, N (two steps each), and mixed steps: a decode batch plus a
//     T/2 prefill chunk of one more sequence (N+1 in all), which climbs
//     on its own and starts again from 0 when it would pass S.
//
// The first forward of each shape of the warm-up is not measured: a warm-up
// sequence runs one chunk of every length and one decode first.

// session drives one stage's manager and worker plugins directly, one
// designed forward at a time: the manager reserves and commits exactly as
// the engine's step does, so each forward runs on real block tables.
type session struct {
	cfg     *config.Config
	name    string // the config file, for the points
	m       kvcache.Manager
	w       worker.Worker
	stage   StageSim
	vocab   int
	step    uint64
	hist    map[kvcache.SeqID]int // history per live sequence
	last    map[kvcache.SeqID]int32
	release []kvcache.SeqID // released since the last forward
	points  []hw.CalibrationPoint
	record  bool
	repeat  int // forwards per recorded point (the median is kept)
	log     io.Writer
	budget  time.Duration
	started time.Time
}

// part is one sequence's share of a designed forward.
type part struct {
	seq    kvcache.SeqID
	tokens int
	sample bool
}

// capacityTokens is the most tokens the device pools hold over all
// sequences (the smallest token pool), 0 when no pool counts tokens.
func capacityTokens(l kvcache.Layout) int {
	best := 0
	for _, p := range l.Pools {
		if p.Tier == kvcache.TierHost || p.TokensPerBlock == 0 || p.Window > 0 {
			continue
		}
		if n := p.Blocks * p.TokensPerBlock; best == 0 || n < best {
			best = n
		}
	}
	return best
}

// token is the deterministic token at position pos of sequence seq.
func (s *session) token(seq kvcache.SeqID, pos int) int32 {
	return int32((uint64(pos)*7919 + uint64(seq)*104729 + 17) % uint64(s.vocab))
}

// errBudget stops the design when measuring took twice the budget (a rung
// that climbs far slower than the ones before it).
var errBudget = errors.New("the measuring took twice --budget")

// forward runs one designed forward: reserve, forward, commit, as one
// engine step does, and records it when s.record is set.
func (s *session) forward(ctx context.Context, kind string, parts []part) error {
	if s.record && s.budget > 0 && time.Since(s.started) > 2*s.budget {
		return errBudget
	}
	t0 := time.Now()
	items := make([]kvcache.ReserveItem, len(parts))
	for i, p := range parts {
		_, live := s.hist[p.seq]
		items[i] = kvcache.ReserveItem{Seq: p.seq, Tokens: p.tokens, New: !live}
	}
	grants, err := s.m.Reserve(ctx, items)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	b := worker.Batch{Step: s.step + 1, Released: s.release}
	work := make([]Work, len(parts))
	tokens := 0
	for i, g := range grants {
		p := parts[i]
		if !g.OK {
			_ = s.m.Unreserve(ctx, seqsOf(grants[:i]))
			return fmt.Errorf("the cache manager denied %d tokens of sequence %d at %d: %s (lower max_batch_size or max_seq_len, or raise kv_cache_config.max_tokens)",
				p.tokens, p.seq, s.hist[p.seq], g.Reason)
		}
		pos := s.hist[p.seq]
		toks := make([]int32, p.tokens)
		for j := range toks {
			toks[j] = s.token(p.seq, pos+j)
		}
		if t, ok := s.last[p.seq]; ok && p.tokens == 1 {
			toks[0] = t // a decode step feeds back the token sampled last
		}
		b.Items = append(b.Items, worker.Item{Seq: p.seq, Pos: pos, Tokens: toks, Sample: p.sample, Tables: g.Tables, Snapshots: g.Snapshots})
		b.Copies = append(b.Copies, g.Copies...)
		work[i] = Work{Context: pos + p.tokens, New: p.tokens, Sample: p.sample}
		tokens += p.tokens
	}
	// The forward, repeat times when recording (the same tokens at the same
	// positions: the KV it writes is the same, and table deltas are
	// idempotent); the point takes the median device and host times.
	n := 1
	if s.record {
		n = max(1, s.repeat)
	}
	var r worker.Result
	reserveS := time.Since(t0).Seconds()
	devs, hosts := make([]float64, n), make([]float64, n)
	for k := range n {
		t1 := time.Now()
		var err error
		r, err = s.w.Forward(ctx, b)
		hosts[k] = time.Since(t1).Seconds()
		if err != nil {
			return fmt.Errorf("forward: %w", err)
		}
		devs[k] = float64(r.Nanos) / 1e9
		s.step++
		b.Step, b.Released = s.step+1, nil
	}
	slices.Sort(devs)
	slices.Sort(hosts)
	dev, host := devs[n/2], hosts[n/2]
	tFwd := time.Now()
	s.release = nil
	commits := make([]kvcache.CommitItem, len(parts))
	for i, p := range parts {
		commits[i] = kvcache.CommitItem{Seq: p.seq, Accepted: p.tokens}
		s.hist[p.seq] += p.tokens
	}
	for _, o := range r.Outputs {
		if len(o.Tokens) > 0 {
			s.last[o.Seq] = o.Tokens[len(o.Tokens)-1]
		}
	}
	cr, err := s.m.Commit(ctx, commits)
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if len(cr.Copies) > 0 {
		if err := s.w.CopyBlocks(ctx, cr.Copies); err != nil {
			return fmt.Errorf("copy blocks: %w", err)
		}
	}
	// The step as one forward would make it: reserve and commit once, the
	// median forward.
	stepS := reserveS + host + time.Since(tFwd).Seconds()
	if !s.record {
		return nil
	}
	if r.Modelled {
		return fmt.Errorf("the worker modelled its time instead of measuring it (device %s)", s.cfg.Device)
	}
	datasheetS, fs := s.stage.Record(work)
	ctxMax := 0
	for _, q := range work {
		ctxMax = max(ctxMax, q.Context)
	}
	pt := hw.CalibrationPoint{Features: fs}
	pt.Config, pt.Kind, pt.Seqs, pt.Tokens, pt.Context = s.name, kind, len(parts), tokens, ctxMax
	pt.MeasuredS = dev
	pt.HostForwardS = host
	pt.StepS = stepS
	pt.DatasheetS = datasheetS
	s.points = append(s.points, pt)
	fmt.Fprintf(s.log, "calibrate: [%3d] %-7s %3d seqs %6d tokens, context %6d: %9.3f ms (host forward %9.3f ms, step %9.3f ms)\n",
		len(s.points), kind, pt.Seqs, pt.Tokens, pt.Context, 1e3*pt.MeasuredS, 1e3*pt.HostForwardS, 1e3*pt.StepS)
	return nil
}

func seqsOf(gs []kvcache.Grant) []kvcache.SeqID {
	out := make([]kvcache.SeqID, len(gs))
	for i, g := range gs {
		out[i] = g.Seq
	}
	return out
}

func (s *session) releaseSeqs(ctx context.Context, seqs []kvcache.SeqID) error {
	if len(seqs) == 0 {
		return nil
	}
	if err := s.m.Release(ctx, seqs); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	for _, q := range seqs {
		delete(s.hist, q)
		delete(s.last, q)
	}
	s.release = append(s.release, seqs...)
	return nil
}

// overBudget says whether the measuring time is spent: the design stops
// before its next rung.
func (s *session) overBudget() bool {
	return s.budget > 0 && time.Since(s.started) > s.budget
}

// calibDesign runs the measurement design (see the top of this file) and
// returns the number of rungs it skipped for the time budget.
func (s *session) calibDesign(ctx context.Context, layout kvcache.Layout) (int, error) {
	n, S, T := s.cfg.MaxBatchSize, s.cfg.MaxSeqLen, s.cfg.MaxNumTokens
	var batches []int
	for _, b := range []int{1, 2, n / 4, n / 2, n} {
		if b >= 1 && !slices.Contains(batches, b) {
			batches = append(batches, b)
		}
	}
	headroom := 2*len(batches) + 2
	if S <= 2*headroom+8 {
		return 0, refuse(fmt.Errorf("calibrate: %s: max_seq_len %d is too short to measure; allowed: > %d", s.name, S, 2*headroom+8))
	}
	need := (n + 1) * S
	if c := capacityTokens(layout); c > 0 && c < need {
		return 0, refuse(fmt.Errorf("calibrate: %s: the design needs (max_batch_size %d + 1) x max_seq_len %d = %d tokens of KV cache; the layout holds %d: "+
			"lower max_batch_size or max_seq_len, or raise kv_cache_config.max_tokens", s.name, n, S, need, c))
	}
	var chunks []int
	for _, d := range []int{1, 2, 4, 8} {
		if c := T / d; c >= 1 && !slices.Contains(chunks, c) {
			chunks = append(chunks, c)
		}
	}

	// Warm-up, not measured: one chunk of every length and a decode.
	s.record = false
	warm := kvcache.SeqID(1 << 20)
	for _, c := range chunks {
		if s.hist[warm]+c+1 > S {
			break
		}
		if err := s.forward(ctx, "warm-up", []part{{seq: warm, tokens: c}}); err != nil {
			return 0, err
		}
	}
	if err := s.forward(ctx, "warm-up", []part{{seq: warm, tokens: 1, sample: true}}); err != nil {
		return 0, err
	}
	if err := s.releaseSeqs(ctx, []kvcache.SeqID{warm}); err != nil {
		return 0, err
	}
	s.record = true
	s.started = time.Now()

	seqs := make([]kvcache.SeqID, n)
	for i := range seqs {
		seqs[i] = kvcache.SeqID(i + 1)
	}
	extra := kvcache.SeqID(n + 1) // the mixed steps' prefill (ids after it stay unused by the others)
	rungs := []int{S / 4, S / 2, S - headroom}
	for r, target := range rungs {
		if r > 0 && s.overBudget() {
			fmt.Fprintf(s.log, "calibrate: %s: the time budget is spent; %d of %d context rungs skipped\n", s.name, len(rungs)-r, len(rungs))
			return len(rungs) - r, nil
		}
		// Climb: pack the sequences' next chunks into forwards of at most
		// T tokens.
		for {
			var fwd []part
			used := 0
			for i, q := range seqs {
				left := target - s.hist[q]
				if left <= 0 {
					continue
				}
				c := min(chunks[i%len(chunks)], left)
				if used+c > T {
					break
				}
				fwd = append(fwd, part{seq: q, tokens: c})
				used += c
			}
			if len(fwd) == 0 {
				break
			}
			if err := s.forward(ctx, hw.KindPrefill, fwd); err != nil {
				return 0, err
			}
		}
		for _, b := range batches {
			for range 2 {
				fwd := make([]part, b)
				for i := range fwd {
					fwd[i] = part{seq: seqs[i], tokens: 1, sample: true}
				}
				if err := s.forward(ctx, hw.KindDecode, fwd); err != nil {
					return 0, err
				}
			}
		}
		for _, b := range []int{1, max(1, n/2)} {
			c := max(1, T/2)
			if c+b > T {
				c = T - b
			}
			if c < 1 {
				continue
			}
			if s.hist[extra]+c > S {
				if err := s.releaseSeqs(ctx, []kvcache.SeqID{extra}); err != nil {
					return 0, err
				}
				extra++ // a fresh sequence: ids are never reused
			}
			fwd := []part{{seq: extra, tokens: c}}
			for i := range b {
				fwd = append(fwd, part{seq: seqs[i], tokens: 1, sample: true})
			}
			if err := s.forward(ctx, hw.KindMixed, fwd); err != nil {
				return 0, err
			}
		}
	}
	live := slices.Collect(func(yield func(kvcache.SeqID) bool) {
		for q := range s.hist {
			if !yield(q) {
				return
			}
		}
	})
	slices.Sort(live)
	return 0, s.releaseSeqs(ctx, live)
}
