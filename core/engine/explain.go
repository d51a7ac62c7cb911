package engine

import (
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// cacheUse is what the prefix cache did for a request's first admission:
// the reused prompt tokens by tier, and the computed ones by why the cache
// did not supply them. Work recomputed after a preemption is not in it
// (request.recomputed).
type cacheUse struct {
	done   bool // the first admission ran and was accounted
	reused int  // prompt tokens the cache supplied
	host   int  // of reused, those the host tier held
	// miss explains the computed tokens from reused to the prompt's last
	// full block (missTokens of them); partial are the tokens past it,
	// which no cache supplies (a partial block, or the last token).
	miss       kvcache.Explanation
	missTokens int
	partial    int
}

// reason is the request's first miss reason: why the first prompt token
// it computed was not reused.
func (c cacheUse) reason() kvcache.MissReason {
	if c.missTokens == 0 {
		return kvcache.MissPartialBlock
	}
	return c.miss.Miss
}

// accountCache records the first admission of r, whose first prefill chunk
// took reuse tokens from the cache: by tier (the grant's HostReused) and,
// for the computed prompt tokens, by reason. Tokens from the match to the
// last full block before the prompt's last token take the explanation's
// reason (reuse_off with reuse off, unknown from a manager that does not
// explain); the rest take partial_block. So reused + computed == prompt.
// A request preempted before its first chunk completed is not accounted
// (finishOnce counts that prefill as recomputed, as it always has), so the
// totals are over the requests whose record has a cache use.
func (e *Engine) accountCache(r *request, reuse int) {
	if r.cache.done {
		return
	}
	ex := r.explain
	if !e.spec.Managers[0].EnableBlockReuse {
		ex = kvcache.Explanation{Miss: kvcache.MissReuseOff}
	}
	full := 0 // the end of the last full block before the last token
	if tpb := e.spec.Managers[0].TokensPerBlock; tpb > 0 && r.prompt > 0 {
		full = (r.prompt - 1) / tpb * tpb
	}
	c := cacheUse{done: true, reused: reuse, host: min(r.hostReused, reuse), miss: ex}
	c.missTokens = max(0, full-reuse)
	c.partial = r.prompt - reuse - c.missTokens
	if c.missTokens == 0 || c.miss.Miss == kvcache.MissPartialBlock {
		// A match that ends at the last full block is a partial-block
		// miss whatever the manager said of the block past it.
		c.miss = kvcache.Explanation{Miss: kvcache.MissPartialBlock}
		c.partial += c.missTokens
		c.missTokens = 0
	}
	r.cache = c
	e.ceil.Count(uint64(r.id))
	t := &e.rep.Tokens
	t.PrefixReused += int64(reuse)
	t.PrefixReusedByTier.Host += int64(c.host)
	t.PrefixReusedByTier.Device += int64(reuse - c.host)
	if t.MissReasons == nil {
		t.MissReasons = missHistogram()
	}
	h := t.MissReasons[c.reason().String()]
	h.Requests++
	h.Tokens += int64(c.missTokens)
	t.MissReasons[c.reason().String()] = h
	if c.partial > 0 {
		p := t.MissReasons[kvcache.MissPartialBlock.String()]
		p.Tokens += int64(c.partial)
		t.MissReasons[kvcache.MissPartialBlock.String()] = p
	}
}

// missHistogram is an empty histogram over every reason.
func missHistogram() map[string]report.MissCount {
	h := make(map[string]report.MissCount, len(kvcache.MissReasons()))
	for _, m := range kvcache.MissReasons() {
		h[m.String()] = report.MissCount{}
	}
	return h
}

// cacheRecord is r's cache use for its report record; nil before its first
// admission.
func cacheRecord(r *request) *report.CacheUse {
	c := r.cache
	if !c.done {
		return nil
	}
	u := &report.CacheUse{
		ReusedDevice: c.reused - c.host, ReusedHost: c.host,
		Computed: r.prompt - c.reused, Reason: c.reason().String(),
		ReasonTokens: c.missTokens, PartialBlockTokens: c.partial,
	}
	if c.miss.Miss == kvcache.MissEvicted {
		u.EvictedTier, u.EvictedBy = string(c.miss.EvictedTier), c.miss.EvictedBy
		if c.miss.EvictedAt > 0 {
			at := float64(c.miss.EvictedAt) / 1e9
			u.EvictedAtS = &at
		}
	}
	return u
}
