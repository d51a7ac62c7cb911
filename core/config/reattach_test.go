package config

import (
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// TestReattachVariablesAreNotKeys: a plugin's reattach variable (debug
// mode) in kvx's environment is left to core/host, while any other unknown
// KVX_ variable is still an error.
func TestReattachVariablesAreNotKeys(t *testing.T) {
	if ReattachEnvPrefix != pluginrpc.ReattachEnvPrefix {
		t.Fatalf("ReattachEnvPrefix = %q, pluginrpc.ReattachEnvPrefix = %q: they must agree", ReattachEnvPrefix, pluginrpc.ReattachEnvPrefix)
	}
	sets := []string{"model=llama-3.1-8b"}
	reattach := pluginrpc.ReattachEnv("kvx-fifo") + `={"protocol":"grpc","version":2,"network":"unix","address":"/tmp/p","pid":7}`
	if _, _, err := Load(testReg, nil, []string{reattach}, sets); err != nil {
		t.Errorf("Load with %s: %v, want no error", reattach, err)
	}
	_, _, err := Load(testReg, nil, []string{"KVX_REATTACHED=1"}, sets)
	if err == nil || !strings.Contains(err.Error(), "KVX_REATTACHED") {
		t.Errorf("Load with KVX_REATTACHED=1: %v, want an unknown-key error naming it", err)
	}
}
