package sdk

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

func TestDefaultLoggerLevel(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want hclog.Level
	}{
		{"", hclog.Info},
		{"debug", hclog.Debug},
		{"TRACE", hclog.Trace},
		{"error", hclog.Error},
		{"loud", hclog.Info},
	} {
		t.Setenv(pluginrpc.LogLevelEnv, tc.env)
		if got := DefaultLogger().GetLevel(); got != tc.want {
			t.Errorf("%s=%q: level %v, want %v", pluginrpc.LogLevelEnv, tc.env, got, tc.want)
		}
	}
}

func TestWithLoggerBecomesDefault(t *testing.T) {
	defer hclog.SetDefault(hclog.Default())
	var buf bytes.Buffer
	l := hclog.New(&hclog.LoggerOptions{Output: &buf, JSONFormat: true})
	if got := setup([]Option{WithLogger(l)}); got != l {
		t.Fatalf("setup(WithLogger(l)) = %v, want l", got)
	}
	hclog.Default().Info("hello from the plugin")
	if !strings.Contains(buf.String(), `"@message":"hello from the plugin"`) {
		t.Errorf("hclog.Default() did not write to the WithLogger logger: %q", buf.String())
	}
}

// TestServeByHandExits: a plugin binary run without the host prints a
// notice and exits with status 1 instead of hanging.
func TestServeByHandExits(t *testing.T) {
	if os.Getenv("KVX_SDK_TEST_SERVE") == "1" {
		ServeCacheManager(func() kvcache.Manager { return nil })
		os.Exit(0) // not reached when Serve refuses to run
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeByHandExits$")
	cmd.Env = append(os.Environ(), "KVX_SDK_TEST_SERVE=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("plugin run by hand: %v, want exit status 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "plugin") {
		t.Errorf("plugin run by hand printed %q, want a notice about plugins", out)
	}
}
