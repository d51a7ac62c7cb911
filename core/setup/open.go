package setup

import (
	"errors"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Prepared is a configuration that passed every check that needs no
// running plugin: it resolved (model, stages, memory budgets, the engine
// spec; Resolve) and the plugin binaries it names were found and match
// their pins (CheckPlugins). Every kvx command opens its engine through
// Prepare and Prepared.Launcher, so no command skips a check another makes.
type Prepared struct {
	*Resolved
	Config *config.Config
	reg    *registry.Registry
}

// Prepare resolves cfg as variant (its workload is not loaded; see
// Workload) and checks its plugins against reg, without starting anything.
// Its errors are the configuration's: Resolve's, then CheckPlugins'.
func Prepare(cfg *config.Config, variant string, reg *registry.Registry) (*Prepared, error) {
	res, err := Resolve(cfg, variant, false)
	if err != nil {
		return nil, err
	}
	if err := CheckPlugins(cfg, reg); err != nil {
		return nil, err
	}
	return &Prepared{Resolved: res, Config: cfg, reg: reg}, nil
}

// Launcher returns a launcher of p's plugins (NewLauncher with the
// registry p was checked against); the caller closes it.
func (p *Prepared) Launcher(log hclog.Logger) *Launcher {
	return NewLauncher(p.Config, p.reg, log)
}

// BudgetHint adds to a configuration a manager refused which setting sized
// the cache where that was kv_cache_config.max_tokens: the manager sees
// only bytes, so its advice to raise the budget cannot say which key.
func (r *Resolved) BudgetHint(err error) error {
	if kvcache.KindOf(err) != kvcache.KindInvalidConfig || errors.Is(err, engine.ErrEvictionPolicy) {
		return err
	}
	for i, b := range r.Budgets {
		if b.MaxTokens > 0 {
			return fmt.Errorf("%w (stage %d's cache budget, %d bytes, is set by %s, not by free_gpu_memory_fraction, which alone would give %d bytes)",
				err, i, b.Cache, b.Binding(), b.FromFraction)
		}
	}
	return err
}
