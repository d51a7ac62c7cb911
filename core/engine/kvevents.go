package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// EventSink receives the KV events the cache managers report (vLLM's
// BlockStored, BlockRemoved and AllBlocksCleared), for a KV-aware router.
// The engine asks the first pipeline stage's manager, which holds every
// prompt's blocks (the other stages hold the same blocks under the same
// keys), once per step, after the step's manager calls were answered, and
// hands the events over in the order they happened. KVEvents is called from
// the engine's loop goroutine; it must not block for long (queue and
// return) and owns evs.
type EventSink interface {
	KVEvents(evs []kvcache.Event)
}

// ErrCacheSaltUnsupported is returned (wrapped) for a salted request when a
// stage's cache manager does not advertise Capabilities.CacheSalt: it would
// ignore the salt and share blocks across salts.
var ErrCacheSaltUnsupported = errors.New("cache_salt is not supported by the cache manager")

// eventsConfig sets cfg.KVEvents for stage st's manager when the engine has
// a sink, the stage is the first and the manager can report events; it
// returns the manager as a reporter then (nil otherwise).
func (e *Engine) eventsConfig(st *stage, m kvcache.Manager, info kvcache.Info, cfg *kvcache.Config) kvcache.EventReporter {
	if e.spec.KVEvents == nil || st.idx != 0 {
		return nil
	}
	er, ok := m.(kvcache.EventReporter)
	if !ok || !info.Capabilities.KVEvents {
		e.log.Warn("KV events are on but the cache manager reports none", "stage", st.idx, "manager", info.Name)
		return nil
	}
	cfg.KVEvents = true
	return er
}

// collectEvents hands the events the first stage recorded since the last
// call to the sink. It costs nothing when events are off.
func (e *Engine) collectEvents(ctx context.Context) error {
	if e.spec.KVEvents == nil || len(e.stages) == 0 || e.stages[0].events == nil {
		return nil
	}
	st := e.stages[0]
	e.dog.arm(slotCall, "cache manager events", e.spec.Liveness.Call, st.m)
	evs, err := st.events.Events(ctx)
	e.dog.disarm(slotCall)
	if err != nil {
		return stageErr(st.idx, "events", err)
	}
	if len(evs) > 0 {
		e.spec.KVEvents.KVEvents(evs)
	}
	return nil
}

// saltErr says why a salted request cannot be served (nil when every
// stage's manager keys its cache by the salt).
func (e *Engine) saltErr() error {
	for _, st := range e.stages {
		if !st.info.Capabilities.CacheSalt {
			return fmt.Errorf("%w: stage %d's %s %s does not advertise the cache_salt capability, so it could share blocks across salts; use a manager that does (v1, v2, mamba) or send no cache_salt",
				ErrCacheSaltUnsupported, st.idx, st.info.Name, st.info.Version)
		}
	}
	return nil
}

// CacheSaltErr is nil when the engine serves salted requests, else why not
// (wrapping ErrCacheSaltUnsupported).
func (lv *Live) CacheSaltErr() error { return lv.salt }

// checkSalt validates one request's cache salt against the limit and the
// managers' capability (nil error for no salt).
func checkSalt(salt string, unsupported error) error {
	if salt == "" {
		return nil
	}
	if len(salt) > kvcache.MaxCacheSaltBytes {
		return &RequestError{Reason: fmt.Sprintf("cache_salt is %d bytes; the limit is %d", len(salt), kvcache.MaxCacheSaltBytes)}
	}
	if unsupported != nil {
		return unsupported
	}
	return nil
}
