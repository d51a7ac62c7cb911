package host

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// TestFeatureText: a plugin with every feature of this kvx is "all N"; one
// without some, or requiring one, is listed, the required starred.
func TestFeatureText(t *testing.T) {
	cur := pluginrpc.Current()
	if got, want := FeatureText(cur), fmt.Sprintf("all %d", len(cur.Features)); got != want {
		t.Errorf("current contract: %q, want %q", got, want)
	}
	less := cur
	less.Features = cur.Features[1:]
	if got := FeatureText(less); strings.HasPrefix(got, "all") || strings.Contains(got, string(cur.Features[0])) || !strings.Contains(got, string(cur.Features[1])) {
		t.Errorf("without %s: %q, want the list of the others", cur.Features[0], got)
	}
	req := cur
	req.Required = cur.Features[:1]
	if got := FeatureText(req); !strings.Contains(got, string(cur.Features[0])+"*") {
		t.Errorf("requiring %s: %q, want it starred", cur.Features[0], got)
	}
	if got := FeatureText(pluginrpc.Contract{Protocol: cur.Protocol}); got != "?" {
		t.Errorf("handshake only: %q, want ?", got)
	}
}
