package setup

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/config"
)

// TestPinnedPlugins: a plugin binary pinned by plugin_sha256 runs only with
// that hash; a mismatch is refused before the run and again at launch,
// naming the file, both hashes and the key.
func TestPinnedPlugins(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(body))
		return hex.EncodeToString(sum[:])
	}
	mgr := write(ManagerBinary("v2"), "#!/bin/sh\nexit 0\n")
	wrk := write(WorkerBinary("gqa"), "#!/bin/sh\nexit 1\n")
	load := func(sets ...string) *config.Config {
		t.Helper()
		cfg, _, err := config.Load(nil, nil, append([]string{"model=llama-3.1-8b", "plugin_dirs=" + dir, "cache_manager=v2", "attention_backend=gqa",
			"isolation=plugin"}, sets...))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	if err := CheckPlugins(load("plugin_sha256.cache_manager="+mgr, "plugin_sha256.attention_backend="+strings.ToUpper(wrk)), Registry{}); err != nil {
		t.Errorf("binaries with their pinned hashes: %v", err)
	}
	err := CheckPlugins(load("plugin_sha256.cache_manager="+wrk), Registry{})
	if !errors.Is(err, ErrPinMismatch) || !strings.Contains(err.Error(), mgr) || !strings.Contains(err.Error(), wrk) ||
		!strings.Contains(err.Error(), "plugin_sha256.cache_manager") {
		t.Errorf("a manager pinned to another hash: %v; want ErrPinMismatch naming both hashes and the key", err)
	}
	l := NewLauncher(load("plugin_sha256.attention_backend="+mgr), Registry{}, nil)
	defer l.Close()
	if _, err := l.Worker(t.Context(), 0); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("launching a worker pinned to another hash: %v; want ErrPinMismatch before it starts", err)
	}
	if _, _, err := config.Load(nil, nil, []string{"model=llama-3.1-8b", "plugin_sha256.cache_manager=abc"}); err == nil ||
		!strings.Contains(err.Error(), "plugin_sha256.cache_manager") || !strings.Contains(err.Error(), "64 hexadecimal") {
		t.Errorf("a 3-character pin: %v; want an error naming the key and the 64 hex digits", err)
	}
}
