// Package registry is what the engine knows of the cache managers and
// attention backends that ship with kvx: for each, the name the config uses,
// its plugin binary, what it serves (a backend's mixers, a manager's
// capabilities) and, for isolation: inprocess, a factory.
//
// The engine never names a plugin itself: config validation (the allowed
// values of cache_manager and attention_backend and their defaults for a
// model), setup (which binary to start, which factory to call), the engine's
// compatibility hints and `kvx plugins` all ask a *Registry. The one
// Registry kvx runs with is cmd/builtin.Registry(), the only package that
// imports both the managers and the backends: this package imports neither,
// so core's arrows stay as DESIGN §7 draws them. A value that names no
// entry and contains a path separator is a plugin binary's path (IsPath).
package registry

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Manager is one built-in cache manager.
type Manager struct {
	Name   string // its cache_manager value: "v2"
	Binary string // its plugin binary's file name: "kvx-cachemgr-v2"
	// Capabilities are what its Info says; the in-process manager and the
	// binary run the same code.
	Capabilities kvcache.Capabilities
	// New makes an unconfigured in-process manager (isolation: inprocess).
	New func() kvcache.Manager
}

// Backend is one built-in attention backend.
type Backend struct {
	Name   string // its attention_backend value: "gqa"
	Binary string // its plugin binary's file name: "kvx-backend-gqa"
	// Mixers are the layer mixers it runs, as its worker's Info says.
	Mixers []spec.Mixer
	// New makes an unconfigured in-process worker (isolation: inprocess).
	New func() worker.Worker
}

// Registry lists the built-in managers and backends, each in the order a
// default is picked: the first that serves a model is its default. A nil
// *Registry has no entries (every value must then be a path). Its methods
// do not modify it, so it may be shared.
type Registry struct {
	Managers []Manager
	Backends []Backend
}

// Check reports every malformed entry at once: an empty name or binary, a
// name twice, a name containing a path separator (it would read as a path),
// a binary without the kvx- prefix kvx plugins lists, no factory, or no
// mixers.
func (r *Registry) Check() error {
	if r == nil {
		return nil
	}
	var probs []string
	seen := map[string]string{}
	entry := func(kind, name, binary string, hasNew, hasMixers bool) {
		what := fmt.Sprintf("%s %q", kind, name)
		switch {
		case name == "":
			probs = append(probs, kind+" with binary "+binary+": empty name")
		case IsPath(name):
			probs = append(probs, what+": a name may not contain a path separator")
		case seen[kind+" "+name] != "":
			probs = append(probs, what+": registered twice")
		}
		seen[kind+" "+name] = binary
		if !strings.HasPrefix(binary, BinaryPrefix) || IsPath(binary) {
			probs = append(probs, fmt.Sprintf("%s: binary %q is not a file name starting with %s", what, binary, BinaryPrefix))
		}
		if !hasNew {
			probs = append(probs, what+": no in-process factory (New)")
		}
		if !hasMixers {
			probs = append(probs, what+": serves no mixer")
		}
	}
	for _, m := range r.Managers {
		entry("cache manager", m.Name, m.Binary, m.New != nil, len(m.Capabilities.Mixers) > 0)
	}
	for _, b := range r.Backends {
		entry("attention backend", b.Name, b.Binary, b.New != nil, len(b.Mixers) > 0)
	}
	if len(probs) > 0 {
		return fmt.Errorf("registry: %s", strings.Join(probs, "; "))
	}
	return nil
}

// BinaryPrefix starts the file name of every kvx plugin binary: what
// `kvx plugins` lists (core/host.NamePrefix; cmd/builtin's test keeps them
// equal).
const BinaryPrefix = "kvx-"

// IsPath reports whether a cache_manager or attention_backend value is a
// plugin binary's path rather than a name: it contains a path separator
// ("./bin/kvx-fifo", "/opt/kvx/kvx-backend-x").
func IsPath(value string) bool {
	return strings.ContainsRune(value, '/') || strings.ContainsRune(value, os.PathSeparator)
}

// Manager returns the manager registered as name.
func (r *Registry) Manager(name string) (Manager, bool) {
	if r != nil {
		for _, m := range r.Managers {
			if m.Name == name {
				return m, true
			}
		}
	}
	return Manager{}, false
}

// Backend returns the backend registered as name.
func (r *Registry) Backend(name string) (Backend, bool) {
	if r != nil {
		for _, b := range r.Backends {
			if b.Name == name {
				return b, true
			}
		}
	}
	return Backend{}, false
}

// ManagerNames returns the managers' names in registry order.
func (r *Registry) ManagerNames() []string {
	if r == nil {
		return nil
	}
	names := make([]string, len(r.Managers))
	for i, m := range r.Managers {
		names[i] = m.Name
	}
	return names
}

// BackendNames returns the backends' names in registry order.
func (r *Registry) BackendNames() []string {
	if r == nil {
		return nil
	}
	names := make([]string, len(r.Backends))
	for i, b := range r.Backends {
		names[i] = b.Name
	}
	return names
}

// ManagerBinary is the plugin binary of a cache_manager value: a
// registered name's Binary, or the value itself when it is a path; "" for
// anything else.
func (r *Registry) ManagerBinary(value string) string {
	if m, ok := r.Manager(value); ok {
		return m.Binary
	}
	if IsPath(value) {
		return value
	}
	return ""
}

// BackendBinary is the plugin binary of an attention_backend value, as
// ManagerBinary.
func (r *Registry) BackendBinary(value string) string {
	if b, ok := r.Backend(value); ok {
		return b.Binary
	}
	if IsPath(value) {
		return value
	}
	return ""
}

// Named returns the entry whose binary is file (a file name, such as
// "kvx-cachemgr-v1"): its kind ("cache_manager" or "attention_backend") and
// name, or "", "" when no entry has that binary.
func (r *Registry) Named(file string) (key, name string) {
	if r != nil {
		for _, m := range r.Managers {
			if m.Binary == file {
				return "cache_manager", m.Name
			}
		}
		for _, b := range r.Backends {
			if b.Binary == file {
				return "attention_backend", b.Name
			}
		}
	}
	return "", ""
}

// Setting is the setting that picks the plugin binary named file of kind
// (pluginrpc.ManagerPluginName or WorkerPluginName, as it answered):
// "cache_manager: v1" for a registered binary, "cache_manager: PATH" (or
// attention_backend) for another plugin of a known kind, "-" otherwise.
func (r *Registry) Setting(file, kind string) string {
	if key, name := r.Named(file); key != "" {
		return key + ": " + name
	}
	switch kind {
	case pluginrpc.ManagerPluginName:
		return "cache_manager: PATH"
	case pluginrpc.WorkerPluginName:
		return "attention_backend: PATH"
	}
	return "-"
}

// Settings pairs every registered name, managers first, with its setting
// and binary: {"cache_manager: v1", "kvx-cachemgr-v1"}.
func (r *Registry) Settings() [][2]string {
	if r == nil {
		return nil
	}
	var out [][2]string
	for _, m := range r.Managers {
		out = append(out, [2]string{"cache_manager: " + m.Name, m.Binary})
	}
	for _, b := range r.Backends {
		out = append(out, [2]string{"attention_backend: " + b.Name, b.Binary})
	}
	return out
}

// ModelMixers returns the distinct mixers of m's layers that need a
// cache-managing manager and a backend kernel, in layer order: every mixer
// but spec.MixerNone (a pure FFN layer runs on any backend and holds no
// cache).
func ModelMixers(m spec.Model) []spec.Mixer {
	var out []spec.Mixer
	for _, l := range m.Layers {
		if l.Mixer != spec.MixerNone && !slices.Contains(out, l.Mixer) {
			out = append(out, l.Mixer)
		}
	}
	return out
}

// missing returns the mixers of need that has does not list.
func missing(need, has []spec.Mixer) []spec.Mixer {
	var out []spec.Mixer
	for _, x := range need {
		if !slices.Contains(has, x) {
			out = append(out, x)
		}
	}
	return out
}

// Missing returns the mixers of need that backend b does not run (nil: b
// runs them all).
func (b Backend) Missing(need []spec.Mixer) []spec.Mixer { return missing(need, b.Mixers) }

// Missing returns the mixers of need whose caches manager m does not manage
// (nil: it manages them all).
func (m Manager) Missing(need []spec.Mixer) []spec.Mixer {
	return missing(need, m.Capabilities.Mixers)
}

// BackendsFor returns, in registry order, the backends that run every mixer
// of need; the first is the default.
func (r *Registry) BackendsFor(need []spec.Mixer) []Backend {
	var out []Backend
	if r != nil {
		for _, b := range r.Backends {
			if b.Missing(need) == nil {
				out = append(out, b)
			}
		}
	}
	return out
}

// ManagersFor returns, in registry order, the managers that manage every
// mixer of need; the first is the default.
func (r *Registry) ManagersFor(need []spec.Mixer) []Manager {
	var out []Manager
	if r != nil {
		for _, m := range r.Managers {
			if m.Missing(need) == nil {
				out = append(out, m)
			}
		}
	}
	return out
}

// Or joins names for a message: "a", "a or b", "a, b or c".
func Or(names []string) string {
	switch len(names) {
	case 0:
		return "none"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// MixerList renders mixers for a message: "gqa, mamba".
func MixerList(mixers []spec.Mixer) string {
	s := make([]string, len(mixers))
	for i, x := range mixers {
		s[i] = string(x)
		if x == spec.MixerNone {
			s[i] = "none (ffn only)"
		}
	}
	return strings.Join(s, ", ")
}
