package pluginrpc

import (
	"testing"

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
