package sim

import (
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// MixerFunc adds to w the work on one rank of layer l's mixer (never
// MixerNone) for batch b: its projections, its attention or scan, and its
// cache reads and writes. It must be pure and must not retain l or b.
type MixerFunc func(e *Env, l *spec.Layer, b *Batch, w *Work)

// StageConfig describes one pipeline stage for NewStage.
type StageConfig struct {
	Env    *Env
	Layers []spec.Layer // the stage's layers in order; copied
	Embed  bool         // first stage: embedding lookup
	Head   bool         // last stage: LM head over the positions that need logits
	// DraftTokens is the MTP drafts per sampling item per step. MTP layers
	// cost nothing when it is 0 (the MTP head is not run).
	DraftTokens int
	Mixer       MixerFunc
}

// Step is one forward of a stage.
type Step struct {
	Batch
	// Logits is the number of positions that need logits: 1 + Draft for each
	// item that samples (the drafts are verified).
	Logits int
	// Sampled are the items that sample, each as a 1-token decode at its
	// context: the MTP head runs its later passes over them.
	Sampled Batch

	// Work in progress, here rather than on the stack because the MixerFunc
	// is an indirect call (a pointer to a local would escape and allocate).
	acc, tmp Work
}

// Stage is the precomputed cost model of one pipeline stage. Identical
// layers are grouped at NewStage, so a forward costs one mixer call per
// distinct mixer layer, not one per layer.
type Stage struct {
	env    *Env
	mixer  MixerFunc
	embed  bool
	head   bool
	draft  int
	mixers []group // distinct mixer parts of the decoder layers
	ffns   []group // distinct FFN parts of the decoder layers
	layers int     // decoder layers (each pays HW.LaunchLatency)
	mtp    []spec.Layer
}

// group is n layers whose mixer (or FFN) part costs the same.
type group struct {
	l spec.Layer
	n float64
}

// NewStage groups the layers and returns the stage model. It fails when the
// config lacks an Env or a Mixer while a layer needs one.
func NewStage(c StageConfig) (*Stage, error) {
	if c.Env == nil {
		return nil, fmt.Errorf("sim stage: no Env")
	}
	if c.DraftTokens < 0 {
		return nil, fmt.Errorf("sim stage: draft tokens %d must be >= 0", c.DraftTokens)
	}
	s := &Stage{env: c.Env, mixer: c.Mixer, embed: c.Embed, head: c.Head, draft: c.DraftTokens}
	for i := range c.Layers {
		l := c.Layers[i]
		l.Buffers = slices.Clone(l.Buffers)
		if l.Mixer != spec.MixerNone && c.Mixer == nil {
			return nil, fmt.Errorf("sim stage: layer %d has mixer %q but no MixerFunc was given", l.Index, l.Mixer)
		}
		if l.MTP {
			s.mtp = append(s.mtp, l)
			continue
		}
		s.layers++
		if l.Mixer != spec.MixerNone {
			s.mixers = addGroup(s.mixers, l, sameMixer)
		}
		if l.FFN != spec.FFNNone {
			s.ffns = addGroup(s.ffns, l, func(a, b *spec.Layer) bool { return a.FFN == b.FFN })
		}
	}
	return s, nil
}

func sameMixer(a, b *spec.Layer) bool {
	return a.Mixer == b.Mixer && a.Window == b.Window && slices.Equal(a.Buffers, b.Buffers)
}

func addGroup(gs []group, l spec.Layer, same func(a, b *spec.Layer) bool) []group {
	for i := range gs {
		if same(&gs[i].l, &l) {
			gs[i].n++
			return gs
		}
	}
	return append(gs, group{l: l, n: 1})
}

// Forward returns the modelled work of one forward on one rank; it uses st
// as scratch, so one Step must not be used by two calls at once. Seconds is
// the stage's device time:
//
//	embedding (first stage)
//	+ per decoder layer: mixer part + all-reduce, FFN part + all-reduce, launch latency
//	+ MTP layers when DraftTokens > 0 (see below)
//	+ LM head over Logits positions (last stage)
//
// The MTP head first runs each MTP layer over the whole batch (it builds its
// own cache for every new token, plus the projection of [embedding; hidden])
// and proposes the first draft through the LM head; each further draft is
// one more pass over the sampling items, one token each.
//
// With a calibration (Env.Calibrated) the per-layer launch latency gives way
// to the calibration's launch cost per kernel, and the forward pays its step
// overhead once.
func (s *Stage) Forward(st *Step) Work {
	return s.forward(st, nil)
}

// Record is Forward that also returns every kernel it added, as the
// features a calibration is fitted to (calib.go): identical layers are one
// Feature whose Count is the number of layers. The slice is the caller's.
func (s *Stage) Record(st *Step) (Work, []Feature) {
	fs := []Feature{}
	w := s.forward(st, &fs)
	return w, fs
}

func (s *Stage) forward(st *Step, rec *[]Feature) Work {
	e := s.env
	w, g := &st.acc, &st.tmp
	*w = Work{rec: rec, weight: 1}
	if s.embed {
		Embed(e, w, st.Tokens)
	}
	for i := range s.mixers {
		*g = Work{mixer: s.mixers[i].l.Mixer, rec: rec, weight: s.mixers[i].n}
		s.mixer(e, &s.mixers[i].l, &st.Batch, g)
		AllReduce(e, g, st.Tokens)
		w.AddScaled(*g, s.mixers[i].n)
	}
	for i := range s.ffns {
		*g = Work{rec: rec, weight: s.ffns[i].n}
		FFN(e, g, &s.ffns[i].l, st.Tokens)
		AllReduce(e, g, st.Tokens)
		w.AddScaled(*g, s.ffns[i].n)
	}
	if e.cal == nil {
		w.Seconds += float64(s.layers) * e.HW.LaunchLatency
	}
	if s.draft > 0 && len(s.mtp) > 0 && st.Sampled.Tokens > 0 {
		s.mtpWork(w, st)
	}
	if s.head {
		LMHead(e, w, st.Logits)
	}
	if e.cal != nil {
		w.Seconds += e.cal.step
	}
	out := *w
	out.mixer, out.rec, out.weight = "", nil, 0
	*w, *g = Work{}, Work{} // keep no recorder
	return out
}

func (s *Stage) mtpWork(w *Work, st *Step) {
	e := s.env
	h := e.Model.Hidden
	pass := func(b *Batch) {
		Linear(e, w, 2*h, h, b.Tokens, false) // eh_proj of [embedding; hidden]
		for i := range s.mtp {
			l := &s.mtp[i]
			if l.Mixer != spec.MixerNone {
				w.mixer = l.Mixer
				s.mixer(e, l, b, w)
				w.mixer = ""
				AllReduce(e, w, b.Tokens)
			}
			if l.FFN != spec.FFNNone {
				FFN(e, w, l, b.Tokens)
				AllReduce(e, w, b.Tokens)
			}
			if e.cal == nil {
				w.Seconds += e.HW.LaunchLatency
			}
		}
		LMHead(e, w, st.Sampled.Tokens)
	}
	pass(&st.Batch)
	for range s.draft - 1 {
		pass(&st.Sampled)
	}
}
