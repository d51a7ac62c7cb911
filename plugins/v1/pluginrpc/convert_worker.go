package pluginrpc

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

func toProtoWorkerInfo(in worker.Info) *kvxpb.WorkerInfo {
	return &kvxpb.WorkerInfo{
		Name:        in.Name,
		Version:     in.Version,
		Protocols:   ints[int64](in.Protocols),
		Device:      in.Device,
		Mixers:      strs[string](in.Mixers),
		MemoryBytes: in.MemoryBytes,
		FreeBytes:   in.FreeBytes,
	}
}

func fromProtoWorkerInfo(p *kvxpb.WorkerInfo) worker.Info {
	return worker.Info{
		Name:        p.GetName(),
		Version:     p.GetVersion(),
		Protocols:   ints[int](p.GetProtocols()),
		Device:      p.GetDevice(),
		Mixers:      strs[spec.Mixer](p.GetMixers()),
		MemoryBytes: p.GetMemoryBytes(),
		FreeBytes:   p.GetFreeBytes(),
	}
}

func toProtoHardware(h spec.Hardware) *kvxpb.Hardware {
	return &kvxpb.Hardware{
		Name:            h.Name,
		MemoryBytes:     h.MemoryBytes,
		MemBandwidth:    h.MemBandwidth,
		FlopsBf16:       h.FLOPSBF16,
		FlopsFp8:        h.FLOPSFP8,
		FlopsFp4:        h.FLOPSFP4,
		NvlinkBandwidth: h.NVLinkBW,
		PcieBandwidth:   h.PCIeBW,
		Uncalibrated:    h.Uncalibrated,
		LaunchLatency:   h.LaunchLatency,
		Calibration:     toProtoSimCalibration(h.Calibration),
		CopyLatency:     h.CopyLatency,
	}
}

// toProtoSimCalibration is nil for nil (no calibration).
func toProtoSimCalibration(c *spec.SimCalibration) *kvxpb.SimCalibration {
	if c == nil {
		return nil
	}
	p := &kvxpb.SimCalibration{Name: c.Name, LaunchSeconds: c.LaunchSeconds, StepSeconds: c.StepSeconds}
	for _, k := range c.Classes {
		p.Classes = append(p.Classes, &kvxpb.KernelClassScale{Class: k.Class, ComputeScale: k.ComputeScale, MemoryScale: k.MemoryScale})
	}
	return p
}

// fromProtoSimCalibration is nil for nil (no calibration).
func fromProtoSimCalibration(p *kvxpb.SimCalibration) *spec.SimCalibration {
	if p == nil {
		return nil
	}
	c := &spec.SimCalibration{Name: p.GetName(), LaunchSeconds: p.GetLaunchSeconds(), StepSeconds: p.GetStepSeconds()}
	for _, k := range p.GetClasses() {
		c.Classes = append(c.Classes, spec.KernelClassScale{Class: k.GetClass(), ComputeScale: k.GetComputeScale(), MemoryScale: k.GetMemoryScale()})
	}
	return c
}

func fromProtoHardware(p *kvxpb.Hardware) spec.Hardware {
	return spec.Hardware{
		Name:          p.GetName(),
		MemoryBytes:   p.GetMemoryBytes(),
		MemBandwidth:  p.GetMemBandwidth(),
		FLOPSBF16:     p.GetFlopsBf16(),
		FLOPSFP8:      p.GetFlopsFp8(),
		FLOPSFP4:      p.GetFlopsFp4(),
		NVLinkBW:      p.GetNvlinkBandwidth(),
		PCIeBW:        p.GetPcieBandwidth(),
		Uncalibrated:  p.GetUncalibrated(),
		LaunchLatency: p.GetLaunchLatency(),
		Calibration:   fromProtoSimCalibration(p.GetCalibration()),
		CopyLatency:   p.GetCopyLatency(),
	}
}

// toProtoWorkerConfig fails only when the model cannot be JSON-encoded.
func toProtoWorkerConfig(c worker.Config) (*kvxpb.WorkerConfig, error) {
	model, err := json.Marshal(&c.Model)
	if err != nil {
		return nil, fmt.Errorf("encode Config.Model: %w", err)
	}
	return &kvxpb.WorkerConfig{
		Stage:           int64(c.Stage),
		Stages:          int64(c.Stages),
		ModelJson:       model,
		First:           int64(c.First),
		Last:            int64(c.Last),
		Backend:         c.Backend,
		Device:          c.Device,
		Hardware:        toProtoHardware(c.Hardware),
		TensorParallel:  int64(c.TensorParallel),
		WeightsDtype:    c.WeightsDtype,
		KvDtype:         c.KVDtype,
		Dtype:           c.Dtype,
		Layout:          toProtoLayout(c.Layout),
		Seed:            c.Seed,
		DraftTokens:     int64(c.DraftTokens),
		DraftAcceptance: c.DraftAcceptance,
	}, nil
}

// fromProtoWorkerConfig fails with KindInvalidConfig when model_json does
// not decode. An empty model_json gives the zero spec.Model.
func fromProtoWorkerConfig(p *kvxpb.WorkerConfig) (worker.Config, error) {
	var model spec.Model
	if b := p.GetModelJson(); len(b) > 0 {
		if err := json.Unmarshal(b, &model); err != nil {
			return worker.Config{}, kvcache.Errorf(kvcache.KindInvalidConfig,
				"Config.Model: model_json (%d bytes) is not the JSON of spec.Model: %v", len(b), err)
		}
	}
	model.Layers = share(model.Layers)
	return worker.Config{
		Stage:           int(p.GetStage()),
		Stages:          int(p.GetStages()),
		Model:           model,
		First:           int(p.GetFirst()),
		Last:            int(p.GetLast()),
		Backend:         p.GetBackend(),
		Device:          p.GetDevice(),
		Hardware:        fromProtoHardware(p.GetHardware()),
		TensorParallel:  int(p.GetTensorParallel()),
		WeightsDtype:    p.GetWeightsDtype(),
		KVDtype:         p.GetKvDtype(),
		Dtype:           p.GetDtype(),
		Layout:          fromProtoLayout(p.GetLayout()),
		Seed:            p.GetSeed(),
		DraftTokens:     int(p.GetDraftTokens()),
		DraftAcceptance: p.GetDraftAcceptance(),
	}, nil
}

func toProtoSetup(s worker.Setup) *kvxpb.Setup {
	return &kvxpb.Setup{DeviceBytes: s.DeviceBytes, Notes: share(s.Notes)}
}

func fromProtoSetup(p *kvxpb.Setup) worker.Setup {
	return worker.Setup{DeviceBytes: p.GetDeviceBytes(), Notes: share(p.GetNotes())}
}

// --- Forward ---

func toProtoBatch(b *worker.Batch) *kvxpb.Batch {
	items := b.Items
	n := len(items)
	m := &kvxpb.Batch{
		Step:     b.Step,
		Hidden:   share(b.Hidden),
		Released: fromSeqIDs(b.Released),
		Copies:   toProtoCopyList(b.Copies),
	}
	if n == 0 {
		return m
	}
	m.Seq = make([]uint64, n)
	for i := range items {
		m.Seq[i] = uint64(items[i].Seq)
	}
	m.Pos = column(n, func(i int) int64 { return int64(items[i].Pos) })
	m.Draft = column(n, func(i int) int64 { return int64(items[i].Draft) })
	m.Sample = column(n, func(i int) bool { return items[i].Sample })
	m.TopLogprobs = column(n, func(i int) int64 { return int64(items[i].TopLogprobs) })
	m.Logprobs = column(n, func(i int) bool { return items[i].Logprobs })
	m.Logits = column(n, func(i int) bool { return items[i].Logits })
	m.PromptLogprobs = column(n, func(i int) bool { return items[i].PromptLogprobs })
	m.PromptTopLogprobs = column(n, func(i int) int64 { return int64(items[i].PromptTopLogprobs) })
	m.Next = column(n, func(i int) int32 { return items[i].Next })
	m.Sampling = toProtoSamplings(items)
	m.TokensLen, m.Tokens = concat(n, func(i int) []int32 { return items[i].Tokens })
	m.Tables = toProtoTableDeltas(n, func(i int) []kvcache.TableDelta { return items[i].Tables })
	m.Snapshots = toProtoSnapshotSlots(n, func(i int) []kvcache.SnapshotSlot { return items[i].Snapshots })
	return m
}

func fromProtoBatch(p *kvxpb.Batch) (worker.Batch, error) {
	const msg = "Batch"
	b := worker.Batch{
		Step:     p.GetStep(),
		Hidden:   share(p.GetHidden()),
		Released: toSeqIDs(p.GetReleased()),
	}
	var err error
	if b.Copies, err = fromProtoCopyList(msg, p.GetCopies()); err != nil {
		return worker.Batch{}, err
	}
	seq := p.GetSeq()
	n := len(seq)
	pos, err1 := optional(msg, "pos", p.GetPos(), n)
	draft, err2 := optional(msg, "draft", p.GetDraft(), n)
	sample, err3 := optional(msg, "sample", p.GetSample(), n)
	tokens, err4 := newSplitter(msg, "tokens_len", "tokens", p.GetTokensLen(), p.GetTokens(), n)
	topK, err5 := optional(msg, "top_logprobs", p.GetTopLogprobs(), n)
	lps, err6 := optional(msg, "logprobs", p.GetLogprobs(), n)
	samp, err7 := optional(msg, "sampling", p.GetSampling(), n)
	logits, err8 := optional(msg, "logits", p.GetLogits(), n)
	plp, err9 := optional(msg, "prompt_logprobs", p.GetPromptLogprobs(), n)
	ptop, err10 := optional(msg, "prompt_top_logprobs", p.GetPromptTopLogprobs(), n)
	next, err11 := optional(msg, "next", p.GetNext(), n)
	if err := firstErr(err1, err2, err3, err4, err5, err6, err7, err8, err9, err10, err11); err != nil {
		return worker.Batch{}, err
	}
	if n == 0 {
		if p.GetTables() != nil && len(p.GetTables().GetItem()) > 0 {
			return worker.Batch{}, colError("%s: tables for no items", msg)
		}
		if len(p.GetSnapshots().GetPos()) > 0 {
			return worker.Batch{}, colError("%s: snapshot slots for no items", msg)
		}
		return b, nil
	}
	b.Items = make([]worker.Item, n)
	for i := range b.Items {
		b.Items[i] = worker.Item{
			Seq:         kvcache.SeqID(seq[i]),
			Pos:         int(at(pos, i)),
			Tokens:      tokens.part(i),
			Draft:       int(at(draft, i)),
			Sample:      at(sample, i),
			TopLogprobs: int(at(topK, i)),
			Logprobs:    at(lps, i),
			Sampling:    fromProtoSampling(at(samp, i)),
			Logits:      at(logits, i),

			PromptLogprobs:    at(plp, i),
			PromptTopLogprobs: int(at(ptop, i)),
			Next:              at(next, i),
		}
	}
	if err := fromProtoTableDeltas(msg, p.GetTables(), n, func(i int, ds []kvcache.TableDelta) { b.Items[i].Tables = ds }); err != nil {
		return worker.Batch{}, err
	}
	if err := fromProtoSnapshotSlots(msg, p.GetSnapshots(), n, func(i int, ss []kvcache.SnapshotSlot) { b.Items[i].Snapshots = ss }); err != nil {
		return worker.Batch{}, err
	}
	return b, nil
}

func toProtoResult(r *worker.Result) *kvxpb.Result {
	outs := r.Outputs
	n := len(outs)
	m := &kvxpb.Result{Hidden: share(r.Hidden), Nanos: r.Nanos, Modelled: r.Modelled}
	toProtoPrompt(m, r.Prompt)
	if n == 0 {
		return m
	}
	m.Seq = make([]uint64, n)
	for i := range outs {
		m.Seq[i] = uint64(outs[i].Seq)
	}
	m.TokensLen, m.Tokens = concat(n, func(i int) []int32 { return outs[i].Tokens })
	m.DraftsLen, m.Drafts = concat(n, func(i int) []int32 { return outs[i].Drafts })
	m.LogitsLen, m.Logits = concat(n, func(i int) []float32 { return outs[i].Logits })
	m.TopLogprobsLen, m.TopLogprobsN, m.TopLogprobIds, m.TopLogprobs = toProtoTopLogprobs(outs)
	m.LogprobsLen, m.Logprobs = concat(n, func(i int) []float64 { return outs[i].Logprobs })
	return m
}

// toProtoSamplings is Batch.sampling: nil when every item is greedy (nil
// Sampling), else one entry per item.
func toProtoSamplings(items []worker.Item) []*kvxpb.Sampling {
	if !slices.ContainsFunc(items, func(it worker.Item) bool { return it.Sampling != nil }) {
		return nil
	}
	out := make([]*kvxpb.Sampling, len(items))
	for i := range items {
		out[i] = toProtoSampling(items[i].Sampling)
	}
	return out
}

func toProtoSampling(s *worker.Sampling) *kvxpb.Sampling {
	if s == nil {
		return &kvxpb.Sampling{}
	}
	return &kvxpb.Sampling{
		Has: true, Temperature: s.Temperature, TopP: s.TopP, TopK: int64(s.TopK), MinP: s.MinP, Seed: s.Seed,
		PresencePenalty: s.PresencePenalty, FrequencyPenalty: s.FrequencyPenalty, RepetitionPenalty: s.RepetitionPenalty,
		MinTokens: int64(s.MinTokens), StopIds: share(s.StopIDs), Prompt: int64(s.Prompt), Context: share(s.Context),
	}
}

// fromProtoSampling is nil for a nil message or one without has.
func fromProtoSampling(p *kvxpb.Sampling) *worker.Sampling {
	if !p.GetHas() {
		return nil
	}
	return &worker.Sampling{
		Temperature: p.GetTemperature(), TopP: p.GetTopP(), TopK: int(p.GetTopK()), MinP: p.GetMinP(), Seed: p.GetSeed(),
		PresencePenalty: p.GetPresencePenalty(), FrequencyPenalty: p.GetFrequencyPenalty(), RepetitionPenalty: p.GetRepetitionPenalty(),
		MinTokens: int(p.GetMinTokens()), StopIDs: share(p.GetStopIds()), Prompt: int(p.GetPrompt()), Context: share(p.GetContext()),
	}
}

// toProtoTopLogprobs encodes every output's TopLogprobs as the Result's
// four columns (all nil when no output has a list).
func toProtoTopLogprobs(outs []worker.Output) (lens, counts []int64, ids []int32, lps []float64) {
	lists, entries := 0, 0
	for i := range outs {
		lists += len(outs[i].TopLogprobs)
		for _, l := range outs[i].TopLogprobs {
			entries += len(l)
		}
	}
	if lists == 0 {
		return nil, nil, nil, nil
	}
	lens = make([]int64, len(outs))
	counts = make([]int64, 0, lists)
	ids, lps = make([]int32, 0, entries), make([]float64, 0, entries)
	for i := range outs {
		lens[i] = int64(len(outs[i].TopLogprobs))
		for _, l := range outs[i].TopLogprobs {
			counts = append(counts, int64(len(l)))
			for _, e := range l {
				ids = append(ids, e.ID)
				lps = append(lps, e.Logprob)
			}
		}
	}
	return lens, trimZero(counts), trimZero(ids), trimZero(lps)
}

// topLogprobsSplitter hands out each output's TopLogprobs from the
// Result's columns, checked once by newTopLogprobsSplitter.
type topLogprobsSplitter struct {
	lists splitter[int64] // per output, its lists' entry counts
	ids   []int32
	lps   []float64
	off   int
}

func newTopLogprobsSplitter(msg string, p *kvxpb.Result, n int) (topLogprobsSplitter, error) {
	lens, err := optional(msg, "top_logprobs_len", p.GetTopLogprobsLen(), n)
	if err != nil {
		return topLogprobsSplitter{}, err
	}
	var lists int64
	for i, l := range lens {
		if l < 0 {
			return topLogprobsSplitter{}, colError("%s: top_logprobs_len[%d] = %d, want >= 0", msg, i, l)
		}
		lists += l
	}
	counts := p.GetTopLogprobsN()
	if len(counts) == 0 && lists > 0 {
		counts = make([]int64, lists) // every list empty
	}
	s, err := newSplitter(msg, "top_logprobs_len", "top_logprobs_n", lens, counts, n)
	if err != nil {
		return topLogprobsSplitter{}, err
	}
	ids, lps := p.GetTopLogprobIds(), p.GetTopLogprobs()
	var entries int64
	for j, c := range counts {
		if c < 0 {
			return topLogprobsSplitter{}, colError("%s: top_logprobs_n[%d] = %d, want >= 0", msg, j, c)
		}
		entries += c
	}
	if ids, err = optional(msg, "top_logprob_ids", ids, int(entries)); err != nil {
		return topLogprobsSplitter{}, err
	}
	if lps, err = optional(msg, "top_logprobs", lps, int(entries)); err != nil {
		return topLogprobsSplitter{}, err
	}
	return topLogprobsSplitter{lists: s, ids: ids, lps: lps}, nil
}

// part returns output i's lists; nil when it has none.
func (s *topLogprobsSplitter) part(i int) [][]worker.TokenLogprob {
	counts := s.lists.part(i)
	if len(counts) == 0 {
		return nil
	}
	out := make([][]worker.TokenLogprob, len(counts))
	for j, c := range counts {
		if c == 0 {
			continue
		}
		l := make([]worker.TokenLogprob, c)
		for k := range l {
			l[k] = worker.TokenLogprob{ID: at(s.ids, s.off+k), Logprob: at(s.lps, s.off+k)}
		}
		s.off += int(c)
		out[j] = l
	}
	return out
}

func fromProtoResult(p *kvxpb.Result) (worker.Result, error) {
	const msg = "Result"
	r := worker.Result{Hidden: share(p.GetHidden()), Nanos: p.GetNanos(), Modelled: p.GetModelled()}
	seq := p.GetSeq()
	n := len(seq)
	tokens, err1 := newSplitter(msg, "tokens_len", "tokens", p.GetTokensLen(), p.GetTokens(), n)
	drafts, err2 := newSplitter(msg, "drafts_len", "drafts", p.GetDraftsLen(), p.GetDrafts(), n)
	logits, err3 := newSplitter(msg, "logits_len", "logits", p.GetLogitsLen(), p.GetLogits(), n)
	top, err4 := newTopLogprobsSplitter(msg, p, n)
	lps, err5 := newSplitter(msg, "logprobs_len", "logprobs", p.GetLogprobsLen(), p.GetLogprobs(), n)
	if err := firstErr(err1, err2, err3, err4, err5); err != nil {
		return r, err
	}
	var err error
	if r.Prompt, err = fromProtoPrompt(msg, p); err != nil || n == 0 {
		return r, err
	}
	r.Outputs = make([]worker.Output, n)
	for i := range r.Outputs {
		r.Outputs[i] = worker.Output{
			Seq:         kvcache.SeqID(seq[i]),
			Tokens:      tokens.part(i),
			Drafts:      drafts.part(i),
			Logits:      logits.part(i),
			TopLogprobs: top.part(i),
			Logprobs:    lps.part(i),
		}
	}
	return r, nil
}

func toProtoCopyBlocksRequest(cs []kvcache.Copy) *kvxpb.CopyBlocksRequest {
	return &kvxpb.CopyBlocksRequest{Copies: toProtoCopyList(cs)}
}

func fromProtoCopyBlocksRequest(p *kvxpb.CopyBlocksRequest) ([]kvcache.Copy, error) {
	return fromProtoCopyList("CopyBlocksRequest", p.GetCopies())
}

// toProtoPrompt encodes r.Prompt as m's prompt_* columns (none when empty).
func toProtoPrompt(m *kvxpb.Result, ps []worker.PromptLogprobs) {
	n := len(ps)
	if n == 0 {
		return
	}
	m.PromptSeq = make([]uint64, n)
	for i := range ps {
		m.PromptSeq[i] = uint64(ps[i].Seq)
	}
	m.PromptLen, m.PromptLogprobs = concat(n, func(i int) []float64 { return ps[i].Logprobs })
	m.PromptTopLen = column(n, func(i int) int64 { return int64(len(ps[i].TopLogprobs)) })
	for i := range ps {
		for _, l := range ps[i].TopLogprobs {
			m.PromptTopN = append(m.PromptTopN, int64(len(l)))
			for _, e := range l {
				m.PromptTopIds = append(m.PromptTopIds, e.ID)
				m.PromptTopLogprobs = append(m.PromptTopLogprobs, e.Logprob)
			}
		}
	}
	m.PromptTopN, m.PromptTopIds, m.PromptTopLogprobs = trimZero(m.PromptTopN), trimZero(m.PromptTopIds), trimZero(m.PromptTopLogprobs)
}

// fromProtoPrompt decodes the prompt_* columns, bounding every length by
// the columns it indexes before it allocates.
func fromProtoPrompt(msg string, p *kvxpb.Result) ([]worker.PromptLogprobs, error) {
	seq := p.GetPromptSeq()
	n := len(seq)
	lps, err := newSplitter(msg, "prompt_len", "prompt_logprobs", p.GetPromptLen(), p.GetPromptLogprobs(), n)
	if err != nil {
		return nil, err
	}
	lens, err := optional(msg, "prompt_top_len", p.GetPromptTopLen(), n)
	if err != nil {
		return nil, err
	}
	var lists int64
	for i, l := range lens {
		if l < 0 {
			return nil, colError("%s: prompt_top_len[%d] = %d, want >= 0", msg, i, l)
		}
		lists += l
	}
	counts := p.GetPromptTopN()
	if len(counts) == 0 && lists > 0 {
		counts = make([]int64, lists) // every list empty
	}
	tops, err := newSplitter(msg, "prompt_top_len", "prompt_top_n", lens, counts, n)
	if err != nil {
		return nil, err
	}
	var entries int64
	for j, c := range counts {
		if c < 0 {
			return nil, colError("%s: prompt_top_n[%d] = %d, want >= 0", msg, j, c)
		}
		entries += c
	}
	ids, err := optional(msg, "prompt_top_ids", p.GetPromptTopIds(), int(entries))
	if err != nil {
		return nil, err
	}
	tlps, err := optional(msg, "prompt_top_logprobs", p.GetPromptTopLogprobs(), int(entries))
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	out := make([]worker.PromptLogprobs, n)
	off := 0
	for i := range out {
		out[i] = worker.PromptLogprobs{Seq: kvcache.SeqID(seq[i]), Logprobs: lps.part(i)}
		cs := tops.part(i)
		if len(cs) == 0 {
			continue
		}
		out[i].TopLogprobs = make([][]worker.TokenLogprob, len(cs))
		for j, c := range cs {
			if c == 0 {
				continue
			}
			l := make([]worker.TokenLogprob, c)
			for k := range l {
				l[k] = worker.TokenLogprob{ID: at(ids, off+k), Logprob: at(tlps, off+k)}
			}
			off += int(c)
			out[i].TopLogprobs[j] = l
		}
	}
	return out, nil
}
