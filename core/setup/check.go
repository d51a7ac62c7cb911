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
	"github.com/kvx-dev/kvx/core/registry"
)

// CheckPlugins finds what cfg's cache_manager and attention_backend name,
// without starting anything: with isolation plugin, each plugin binary (a
// registered name's, or the path given) must exist and be executable (the
// error wraps host.ErrNotFound and says where it looked, or, for a path,
// what the file is and what is allowed) and match its plugin_sha256 pin;
// in-process, each must have an implementation in reg. Every problem is
// reported at once.
func CheckPlugins(cfg *config.Config, reg *registry.Registry) error {
	if cfg.Isolation != "plugin" {
		var errs []error
		if _, ok := reg.Manager(cfg.CacheManager); !ok {
			errs = append(errs, inProcessErr("cache_manager", cfg.CacheManager, reg.ManagerNames(), "; use isolation: plugin"))
		}
		if _, ok := reg.Backend(cfg.AttentionBackend); !ok {
			errs = append(errs, inProcessErr("attention_backend", cfg.AttentionBackend, reg.BackendNames(), "; use isolation: plugin"))
		}
		return errors.Join(errs...)
	}
	h := host.New(nil, cfg.PluginDirs)
	defer h.Close()
	var errs []error
	for _, p := range []struct {
		key, value, binary, pinKey, pin string
		names                           []string
	}{
		{"cache_manager", cfg.CacheManager, reg.ManagerBinary(cfg.CacheManager), "plugin_sha256.cache_manager", cfg.PluginSHA256.CacheManager, reg.ManagerNames()},
		{"attention_backend", cfg.AttentionBackend, reg.BackendBinary(cfg.AttentionBackend), "plugin_sha256.attention_backend", cfg.PluginSHA256.AttentionBackend, reg.BackendNames()},
	} {
		path, err := h.Find(p.binary)
		switch {
		case err != nil && registry.IsPath(p.value):
			errs = append(errs, fmt.Errorf("%s: %q is not an executable plugin binary: %w; allowed: %s",
				p.key, p.value, err, allowedPlugins(p.names)))
		case err != nil:
			errs = append(errs, fmt.Errorf("%s %s: %w", p.key, p.value, err))
		default:
			if err := checkPinned(path, p.pinKey, p.pin); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// allowedPlugins is the "allowed:" clause of a cache_manager or
// attention_backend value.
func allowedPlugins(names []string) string {
	if len(names) == 0 {
		return "the path of an executable file"
	}
	return strings.Join(names, ", ") + ", or the path of an executable file (containing a path separator)"
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
