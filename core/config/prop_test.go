package config

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// An integer key set from env or --set either lands in Flatten or fails with
// the range message naming key, value and origin; --set beats env.
func TestIntKeysProperty(t *testing.T) {
	keys := map[string]int{"max_batch_size": 1, "deep_check_every": 0, "workload.concurrency": 0, "max_seq_len": 1}
	names := slices.Sorted(mapKeys(keys))
	rapid.Check(t, func(t *rapid.T) {
		key := rapid.SampledFrom(names).Draw(t, "key")
		v := rapid.OneOf(rapid.IntRange(-5, 300000), rapid.IntRange(1<<31-3, 1<<31+3)).Draw(t, "value")
		viaEnv := rapid.Bool().Draw(t, "env")
		override := rapid.Bool().Draw(t, "override")
		var env, sets []string
		origin := "--set"
		if viaEnv {
			name := EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
			env = []string{fmt.Sprintf("%s=%d", name, v)}
			origin = "env " + name
		} else {
			sets = []string{fmt.Sprintf("%s=%d", key, v)}
		}
		sets = append([]string{"model=llama-3.1-8b"}, sets...)
		if override {
			sets = append(sets, key+"=7") // --set after env (or a later --set) wins
		}
		c, _, err := Load(testReg, nil, env, sets)
		if override {
			if err != nil {
				t.Fatalf("override: %v", err)
			}
			if got := c.Flatten()[key]; got != 7 {
				t.Fatalf("%s = %v after override, want 7", key, got)
			}
			return
		}
		lo := keys[key]
		if v < lo || v > 1<<31-1 {
			want := fmt.Sprintf("%s: %d (%s) is out of range; allowed: %d <= value <= 2147483647", key, v, origin, lo)
			if err == nil || err.Error() != want {
				t.Fatalf("Load error %v, want %q", err, want)
			}
			return
		}
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		if got := c.Flatten()[key]; got != v {
			t.Fatalf("%s = %v, want %d", key, got, v)
		}
	})
}

// Any set of ignored keys gives exactly one notice per key, sorted.
func TestIgnoredKeysProperty(t *testing.T) {
	all := IgnoredKeys()
	rapid.Check(t, func(t *rapid.T) {
		picked := rapid.SliceOfNDistinct(rapid.SampledFrom(all), 0, 8, rapid.ID[string]).Draw(t, "keys")
		sets := []string{"model=deepseek-v3"}
		var want []string
		for _, k := range picked {
			sets = append(sets, k+".nested.value=1")
			want = append(want, "key "+k+" has no effect in kvx")
		}
		slices.Sort(want)
		_, notices, err := Load(testReg, nil, nil, sets)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(notices, want) {
			t.Fatalf("notices %v, want %v", notices, want)
		}
	})
}
