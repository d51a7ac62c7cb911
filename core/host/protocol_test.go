//go:build unix

package host

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// TestUnknownTransportProtocol: a plugin built for a transport protocol
// this kvx does not speak (9) is refused at the handshake with an error
// that names the plugin and both versions, and nothing is left running.
func TestUnknownTransportProtocol(t *testing.T) {
	t.Setenv("FAKEPLUGIN_TRANSPORT", "9")
	h, _ := newHost(t)
	_, _, err := h.LaunchManager(ctxTimeout(t), fakeManager)
	if err == nil {
		t.Fatal("LaunchManager of a protocol-9 plugin succeeded")
	}
	if !errors.Is(err, ErrProtocol) {
		t.Errorf("errors.Is(%v, ErrProtocol) = false", err)
	}
	t.Log(err)
	for _, want := range []string{
		fakeManager,
		"the plugin speaks protocol 9",
		fmt.Sprintf("kvx speaks protocol %d (carrying contract v%d)", pluginrpc.InstancesProtocol, kvcache.ProtocolVersion),
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if n := tracked(h); n != 0 {
		t.Errorf("%d plugin processes still tracked after the refused launch", n)
	}
}

func TestSpeaks(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
	}{
		{[]int{2}, "protocol 2"},
		{[]int{1, 2}, "protocols 1 and 2"},
		{[]int{1, 2, 3}, "protocols 1, 2 and 3"},
	} {
		if got := speaks(tc.in); got != tc.want {
			t.Errorf("speaks(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
