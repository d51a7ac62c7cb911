package setup

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/host"
)

// CheckPlugins finds what cfg's cache_manager and attention_backend name,
// without starting anything: with isolation plugin, each plugin binary
// must exist and be executable (the error wraps host.ErrNotFound and says
// where it looked); in-process, each must have an implementation in reg.
// Both problems are reported at once.
func CheckPlugins(cfg *config.Config, reg Registry) error {
	if cfg.Isolation != "plugin" {
		var errs []error
		if _, ok := reg.Managers[cfg.CacheManager]; !ok {
			errs = append(errs, fmt.Errorf("cache_manager %q has no in-process implementation (known: %s); use isolation: plugin",
				cfg.CacheManager, keys(reg.Managers)))
		}
		if _, ok := reg.Workers[cfg.AttentionBackend]; !ok {
			errs = append(errs, fmt.Errorf("attention_backend %q has no in-process implementation (known: %s)",
				cfg.AttentionBackend, keys(reg.Workers)))
		}
		return errors.Join(errs...)
	}
	h := host.New(nil, cfg.PluginDirs)
	defer h.Close()
	var errs []error
	if path, err := h.Find(ManagerBinary(cfg.CacheManager)); err != nil {
		errs = append(errs, fmt.Errorf("cache_manager %s: %w", cfg.CacheManager, err))
	} else if err := checkPinned(path, "plugin_sha256.cache_manager", cfg.PluginSHA256.CacheManager); err != nil {
		errs = append(errs, err)
	}
	if path, err := h.Find(WorkerBinary(cfg.AttentionBackend)); err != nil {
		errs = append(errs, fmt.Errorf("attention_backend %s: %w", cfg.AttentionBackend, err))
	} else if err := checkPinned(path, "plugin_sha256.attention_backend", cfg.PluginSHA256.AttentionBackend); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ErrPinMismatch is a plugin binary whose SHA-256 is not the one the
// config pins (plugin_sha256).
var ErrPinMismatch = errors.New("plugin binary does not match its pinned SHA-256")

// checkPinned hashes the binary at path and compares it with want (key's
// value; empty: not pinned).
func checkPinned(path, key, want string) error {
	if want == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("%s: read %s: %w", key, path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); !strings.EqualFold(got, want) {
		return fmt.Errorf("%w: %s has SHA-256 %s, %s pins %s; kvx does not run it", ErrPinMismatch, path, got, key, strings.ToLower(want))
	}
	return nil
}
