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
	"github.com/kvx-dev/kvx/core/registry/registrytest"
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
	mgr := write("kvx-cachemgr-v2", "#!/bin/sh\nexit 0\n")
	wrk := write("kvx-backend-gqa", "#!/bin/sh\nexit 1\n")
	load := func(sets ...string) *config.Config {
		t.Helper()
		cfg, _, err := config.Load(registrytest.Builtin(), nil, nil, append([]string{"model=llama-3.1-8b", "plugin_dirs=" + dir, "cache_manager=v2", "attention_backend=gqa",
			"isolation=plugin"}, sets...))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	if err := CheckPlugins(load("plugin_sha256.cache_manager="+mgr, "plugin_sha256.attention_backend="+strings.ToUpper(wrk)), registrytest.Builtin()); err != nil {
		t.Errorf("binaries with their pinned hashes: %v", err)
	}
	err := CheckPlugins(load("plugin_sha256.cache_manager="+wrk), registrytest.Builtin())
	if !errors.Is(err, ErrPinMismatch) || !strings.Contains(err.Error(), mgr) || !strings.Contains(err.Error(), wrk) ||
		!strings.Contains(err.Error(), "plugin_sha256.cache_manager") {
		t.Errorf("a manager pinned to another hash: %v; want ErrPinMismatch naming both hashes and the key", err)
	}
	l := NewLauncher(load("plugin_sha256.attention_backend="+mgr), registrytest.Builtin(), nil)
	defer l.Close()
	if _, err := l.Worker(t.Context(), 0); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("launching a worker pinned to another hash: %v; want ErrPinMismatch before it starts", err)
	}
	if _, _, err := config.Load(registrytest.Builtin(), nil, nil, []string{"model=llama-3.1-8b", "plugin_sha256.cache_manager=abc"}); err == nil ||
		!strings.Contains(err.Error(), "plugin_sha256.cache_manager") || !strings.Contains(err.Error(), "64 hexadecimal") {
		t.Errorf("a 3-character pin: %v; want an error naming the key and the 64 hex digits", err)
	}
}

// TestPluginPaths: an attention_backend given as a path is found, hashed
// and pinned as a cache_manager path is; a path that is not an executable
// file is refused before the run, naming the key, the value and what is
// allowed.
func TestPluginPaths(t *testing.T) {
	dir := t.TempDir()
	body := "#!/bin/sh\nexit 1\n"
	exe := filepath.Join(dir, "kvx-backend-mine")
	if err := os.WriteFile(exe, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "kvx-backend-plain")
	if err := os.WriteFile(plain, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(body))
	pin := hex.EncodeToString(sum[:])
	load := func(sets ...string) *config.Config {
		t.Helper()
		cfg, _, err := config.Load(registrytest.Builtin(), nil, nil, append([]string{"model=llama-3.1-8b", "cache_manager=" + exe, "isolation=plugin"}, sets...))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	reg := registrytest.Builtin()
	if err := CheckPlugins(load("attention_backend="+exe, "plugin_sha256.attention_backend="+pin), reg); err != nil {
		t.Errorf("attention_backend %s pinned to its hash: %v", exe, err)
	}
	if err := CheckPlugins(load("attention_backend="+exe, "plugin_sha256.attention_backend="+strings.Repeat("ab", 32)), reg); !errors.Is(err, ErrPinMismatch) ||
		!strings.Contains(err.Error(), "plugin_sha256.attention_backend") || !strings.Contains(err.Error(), pin) {
		t.Errorf("attention_backend %s pinned to another hash: %v; want ErrPinMismatch naming the key and the hash", exe, err)
	}
	l := NewLauncher(load("attention_backend="+exe, "plugin_sha256.attention_backend="+strings.Repeat("ab", 32)), reg, nil)
	defer l.Close()
	if _, err := l.Worker(t.Context(), 0); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("launching attention_backend %s pinned to another hash: %v; want ErrPinMismatch before it starts", exe, err)
	}
	for _, bad := range []string{filepath.Join(dir, "missing"), plain, dir + "/"} {
		err := CheckPlugins(load("attention_backend="+bad), reg)
		want := `attention_backend: "` + bad + `" is not an executable plugin binary`
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "allowed: dsa, mla, gqa, or the path of an executable file") {
			t.Errorf("attention_backend %s: %v; want %q and what is allowed", bad, err, want)
		}
	}
	cfg := load("attention_backend="+exe, "isolation=inprocess")
	if err := CheckPlugins(cfg, reg); err == nil || !strings.Contains(err.Error(), `attention_backend "`+exe+`" has no in-process implementation`) {
		t.Errorf("attention_backend %s in-process: %v; want a refusal naming it", exe, err)
	}
}
