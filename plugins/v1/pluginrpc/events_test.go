package pluginrpc

import (
	"reflect"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/pipeline"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// plainManager hides every optional interface of the manager it wraps.
type plainManager struct{ kvcache.Manager }

// TestEventsWithoutReporter: over the wire, a served manager that is no
// kvcache.EventReporter has KVEvents cleared from its Info, and Events
// answers KindUnsupported; its CacheSalt capability crosses unchanged.
func TestEventsWithoutReporter(t *testing.T) {
	f := &fakeManager{info: fullInfo}
	m := TestManagerPair(t, plainManager{f})
	info, err := m.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Capabilities.KVEvents || !info.Capabilities.CacheSalt {
		t.Errorf("Info capabilities %+v: want KVEvents false (no EventReporter served), CacheSalt true", info.Capabilities)
	}
	if _, err := m.(kvcache.EventReporter).Events(ctx); kvcache.KindOf(err) != kvcache.KindUnsupported {
		t.Errorf("Events of a manager without them: %v, want KindUnsupported", err)
	}
}

// TestExplainOverWire: an explained lookup reaches the manager's Explain
// with every item field (Now included) and its answer comes back whole, by
// the plain and the started call; a manager that is no Explainer has
// Explain cleared from its Info and answers KindUnsupported.
func TestExplainOverWire(t *testing.T) {
	f := &fakeManager{info: fullInfo, explain: fullExplanations}
	m := TestManagerPair(t, f)
	info, err := m.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Capabilities.Explain || !info.Capabilities.Retention || len(info.Capabilities.EvictionPolicies) != 2 {
		t.Fatalf("Info capabilities %+v: want Explain, Retention and two eviction policies", info.Capabilities)
	}
	got, err := m.(kvcache.Explainer).Explain(ctx, fullLookupItems)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, fullExplanations) {
		t.Fatalf("Explain = %+v, want %+v", got, fullExplanations)
	}
	got, err = pipeline.StartExplain(ctx, m, fullLookupItems, true)()
	if err != nil || !reflect.DeepEqual(got, fullExplanations) {
		t.Fatalf("StartExplain = %+v, %v; want %+v", got, err, fullExplanations)
	}
	f.mu.Lock()
	var calls []any
	for _, c := range f.calls {
		if c.method == "Explain" {
			calls = append(calls, c.arg)
		}
	}
	f.mu.Unlock()
	if len(calls) != 2 || !reflect.DeepEqual(calls[0], fullLookupItems) || !reflect.DeepEqual(calls[1], fullLookupItems) {
		t.Fatalf("the manager's Explain saw %+v, want the items twice", calls)
	}

	p := TestManagerPair(t, plainManager{&fakeManager{info: fullInfo, lookup: []int{64, 0}}})
	info, err = p.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Capabilities.Explain {
		t.Errorf("Info of a manager that is no Explainer says Explain")
	}
	if _, err := p.(kvcache.Explainer).Explain(ctx, fullLookupItems); kvcache.KindOf(err) != kvcache.KindUnsupported {
		t.Errorf("Explain of a manager without it: %v, want KindUnsupported", err)
	}
	// Without explain, StartExplain is a Lookup whose reasons are unknown.
	got, err = pipeline.StartExplain(ctx, p, fullLookupItems, false)()
	want := []kvcache.Explanation{{Tokens: 64}, {Tokens: 0}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("StartExplain(explain false) = %+v, %v; want %+v", got, err, want)
	}
}
