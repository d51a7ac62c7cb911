package config

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/knadh/koanf/providers/confmap"
	kenv "github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/kvx-dev/kvx/core/registry"
)

// EnvPrefix starts every environment variable that Load reads.
const EnvPrefix = "KVX_"

// ReattachEnvPrefix starts the variables Load skips: the SDK debug mode's
// reattach variables (pluginrpc.ReattachEnvPrefix; a test keeps them equal).
const ReattachEnvPrefix = EnvPrefix + "REATTACH_"

// origin says where a value came from, for messages.
type origin struct {
	where string // "file a.yaml", "env KVX_X", "--set"
	rank  int    // source order: later sources override earlier ones
	file  string // the YAML file, when the value came from one
}

// Load builds the configuration from YAML files, then env (a list of
// "NAME=value" strings, e.g. os.Environ(); only KVX_ names are read), then
// sets ("key=value"), each overriding the previous. It returns the config,
// the notices (ignored keys, values beyond the model's limits) and nil; or
// nil, the notices found so far and every error found, joined.
// cache_manager and attention_backend are checked against reg, which
// lists the built-in managers and backends and picks their defaults (nil:
// none, so both must be plugin paths); the Config keeps it (Registry).
func Load(reg *registry.Registry, files []string, env []string, sets []string) (*Config, []string, error) {
	return LoadVaried(reg, files, env, sets, nil)
}

// LoadVaried is Load with varies ("key=value", a kvx compare variant's
// values) after sets, overriding them; messages name them "--vary".
func LoadVaried(reg *registry.Registry, files, env, sets, varies []string) (*Config, []string, error) {
	ld := &loader{origins: map[string]origin{}}
	merged := koanf.New(".")
	rank := 0
	badFile := false
	for _, f := range files {
		k := koanf.New(".")
		if err := k.Load(file.Provider(f), yamlParser{}); err != nil {
			ld.errs = append(ld.errs, fmt.Errorf("config file %s: %w", f, err))
			badFile = true
			continue
		}
		ld.merge(merged, k, func(string) string { return "file " + f }, rank)
		for key := range k.All() {
			o := ld.origins[key]
			o.file = f
			ld.origins[key] = o
		}
		rank++
	}

	envNames := map[string]string{}
	k := koanf.New(".")
	err := k.Load(kenv.Provider(".", kenv.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return env },
		TransformFunc: func(name, value string) (string, any) {
			if strings.HasPrefix(name, ReattachEnvPrefix) {
				return "", nil // read by core/host, not a config key
			}
			key := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, EnvPrefix), "__", "."))
			if key == "" {
				return "", nil
			}
			envNames[key] = name
			return key, parseScalar(value)
		},
	}), nil)
	if err != nil { // the env provider does not fail, but the contract allows it
		ld.errs = append(ld.errs, fmt.Errorf("environment: %w", err))
	} else {
		ld.merge(merged, k, func(key string) string { return "env " + envNameFor(envNames, key) }, rank)
	}
	rank++

	for _, g := range []struct {
		flag  string
		pairs []string
	}{{"--set", sets}, {"--vary", varies}} {
		for _, s := range g.pairs {
			key, value, ok := strings.Cut(s, "=")
			key = strings.TrimSpace(key)
			if !ok || key == "" {
				ld.errs = append(ld.errs, fmt.Errorf("%s %q: want key=value", g.flag, s))
				continue
			}
			var v any
			if err := yamlv3.Unmarshal([]byte(value), &v); err != nil {
				ld.errs = append(ld.errs, fmt.Errorf("%s %s: value %q is not a YAML scalar or flow list: %v", g.flag, key, value, err))
				continue
			}
			k := koanf.New(".")
			_ = k.Load(confmap.Provider(map[string]any{key: v}, "."), nil) // confmap cannot fail
			ld.merge(merged, k, func(string) string { return g.flag }, rank)
			rank++
		}
	}

	if badFile {
		// What the unreadable file set is unknown: checking the rest would
		// only report its keys as missing.
		return nil, ld.notices, errors.Join(ld.errs...)
	}
	c := defaults()
	c.reg = reg
	ld.apply(c, merged.All())
	ld.resolve(c)
	if len(ld.errs) > 0 {
		return nil, ld.notices, errors.Join(ld.errs...)
	}
	return c, ld.notices, nil
}

// envNameFor finds the variable that produced key (or the section above it).
func envNameFor(names map[string]string, key string) string {
	for k := key; ; {
		if n, ok := names[k]; ok {
			return n
		}
		i := strings.LastIndexByte(k, '.')
		if i < 0 {
			return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
		}
		k = k[:i]
	}
}

// parseScalar reads an env value as YAML; a value YAML cannot read stays a string.
func parseScalar(s string) any {
	var v any
	if err := yamlv3.Unmarshal([]byte(s), &v); err != nil {
		return s
	}
	return v
}

type loader struct {
	origins map[string]origin // flattened key -> last source that set it
	errs    []error
	notices []string
	bad     map[string]bool // canonical keys whose value was rejected
	given   map[string]bool // canonical keys given a non-null value
}

func (ld *loader) merge(into, from *koanf.Koanf, where func(key string) string, rank int) {
	for key := range from.All() {
		ld.origins[key] = origin{where: where(key), rank: rank}
	}
	_ = into.Merge(from) // the default merge cannot fail
}

func (ld *loader) originOf(key string) origin {
	if o, ok := ld.origins[key]; ok {
		return o
	}
	// A map value reported under its section: find any key below it.
	best := origin{where: "?"}
	for k, o := range ld.origins {
		if strings.HasPrefix(k, key+".") && o.rank >= best.rank {
			best = o
		}
	}
	return best
}

// valueErr formats "<key>: <value> (<origin>) <problem>".
func (ld *loader) valueErr(key string, v any, problem string) {
	ld.errs = append(ld.errs, fmt.Errorf("%s: %s (%s) %s", key, show(v), ld.originOf(key).where, problem))
}

// show renders a value for messages.
func show(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("%q", x)
	case map[string]any:
		return "a map"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = show(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case float64:
		return fmtFloat(x)
	}
	return fmt.Sprint(v)
}

// apply sets every field from the merged flattened map.
func (ld *loader) apply(c *Config, flat map[string]any) {
	ld.bad = map[string]bool{}
	ld.given = map[string]bool{}
	keys := make([]string, 0, len(flat))
	for k := range flat {
		keys = append(keys, k)
	}
	sort.Strings(keys)

	type setBy struct {
		raw string
		v   any
		o   origin
	}
	chosen := map[string]setBy{} // canonical key -> winning raw key
	ignored := map[string]bool{}
	typeReported := map[string]bool{}
	for _, raw := range keys {
		v := flat[raw]
		canon := raw
		if a, ok := aliases[raw]; ok {
			canon = a
		}
		if _, ok := fieldsByKey[canon]; ok {
			if m, isMap := v.(map[string]any); v == nil || (isMap && len(m) == 0) {
				continue // null or {} = unset
			}
			o := ld.originOf(raw)
			if prev, ok := chosen[canon]; ok {
				switch {
				case prev.o.rank > o.rank:
					continue
				case prev.o.rank == o.rank && show(prev.v) != show(v):
					ld.errs = append(ld.errs, fmt.Errorf("%s: %s and %s: %s (%s) name the same setting with different values",
						canon, prev.raw, raw, show(prev.v)+" vs "+show(v), o.where))
					ld.bad[canon] = true
					continue
				}
			}
			chosen[canon] = setBy{raw, v, o}
			continue
		}
		if ig := ignoredFor(raw); ig != "" {
			ignored[ig] = true
			continue
		}
		if leaf, ok := leafAbove(raw); ok { // e.g. max_batch_size.x: a map where a value belongs
			if !typeReported[leaf] {
				typeReported[leaf] = true
				ld.bad[leaf] = true
				f := fieldsByKey[leaf]
				ld.valueErr(leaf, map[string]any{}, "is not "+f.kind)
			}
			continue
		}
		if sections[raw] {
			if m, ok := v.(map[string]any); (ok && len(m) == 0) || v == nil {
				continue // empty or null section
			}
			ld.valueErr(raw, v, "is not a map")
			continue
		}
		ld.errs = append(ld.errs, unknownKeyError(raw, ld.originOf(raw).where))
	}
	canons := make([]string, 0, len(chosen))
	for k := range chosen {
		canons = append(canons, k)
	}
	sort.Strings(canons)
	for _, canon := range canons {
		s := chosen[canon]
		f := fieldsByKey[canon]
		if problem := f.set(c, s.v); problem != "" {
			ld.bad[canon] = true
			ld.errs = append(ld.errs, fmt.Errorf("%s: %s (%s) %s", s.raw, show(s.v), s.o.where, problem))
			continue
		}
		ld.given[f.key] = true
		for _, k := range f.also { // a one-number range sets both bounds
			ld.given[k] = true
		}
	}
	for _, ig := range slices.Sorted(mapKeys(ignored)) {
		ld.notices = append(ld.notices, fmt.Sprintf("key %s has no effect in kvx", ig))
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// leafAbove returns the known leaf key that is a strict prefix of raw.
func leafAbove(raw string) (string, bool) {
	for i := strings.IndexByte(raw, '.'); i >= 0; {
		p := raw[:i]
		if a, ok := aliases[p]; ok {
			p = a
		}
		if f, ok := fieldsByKey[p]; ok && !f.shorthand {
			return p, true
		}
		j := strings.IndexByte(raw[i+1:], '.')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return "", false
}

// ignoredFor returns the ignored key that raw is or is under, or "".
func ignoredFor(raw string) string {
	for _, ig := range ignoredKeys {
		if raw == ig || strings.HasPrefix(raw, ig+".") {
			return ig
		}
	}
	return ""
}

func unknownKeyError(raw, where string) error {
	s, close := suggest(raw)
	switch {
	case s == "":
		return fmt.Errorf("unknown key %q (%s)", raw, where)
	case close:
		return fmt.Errorf("unknown key %q (%s); did you mean %q?", raw, where, s)
	}
	return fmt.Errorf("unknown key %q (%s); nearest known key: %q", raw, where, s)
}

// crossErr records a failed rule between fields.
func (ld *loader) crossErr(format string, args ...any) {
	ld.errs = append(ld.errs, fmt.Errorf(format, args...))
}

// anyBad reports whether one of keys had its own error (cross rules on it are skipped).
func (ld *loader) anyBad(keys ...string) bool {
	for _, k := range keys {
		if ld.bad[k] {
			return true
		}
	}
	return false
}
