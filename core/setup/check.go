package setup

import (
	"errors"
	"fmt"

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
	if _, err := h.Find(ManagerBinary(cfg.CacheManager)); err != nil {
		errs = append(errs, fmt.Errorf("cache_manager %s: %w", cfg.CacheManager, err))
	}
	if _, err := h.Find(WorkerBinary(cfg.AttentionBackend)); err != nil {
		errs = append(errs, fmt.Errorf("attention_backend %s: %w", cfg.AttentionBackend, err))
	}
	return errors.Join(errs...)
}
