package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzLoad: arbitrary YAML as a config file, plus one arbitrary --set pair,
// through Load (the real file reader, every field's check and the cross
// checks against the model). Properties: no panic; a result or an error,
// never both missing; an error names a key, the file or a flag; and each
// input is answered within a few seconds (YAML's alias expansion is
// bounded by the decoder; a model path from the input is a file that does
// not exist or a bundled preset).
func FuzzLoad(f *testing.F) {
	for _, p := range []string{"testdata/seed_a_000.yml", "testdata/seed_b_003.yml", "../../scenarios/cpu-llama.yaml", "../../scenarios/hf-llama.yaml"} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b, "max_num_tokens=64")
		}
	}
	f.Add([]byte("model: llama-3.1-8b\ndevice: cuda\ndtype: bfloat16\n"), "dtype=fp32")
	f.Add([]byte("a: &a [*a, *a]\n"), "x=[")
	f.Add([]byte("model: deepseek-v3.2\nkv_cache_config: {tokens_per_block: -1}\n"), "kv_cache_config.max_tokens=1e400")
	f.Fuzz(func(t *testing.T, yaml []byte, set string) {
		if len(yaml) > 1<<16 || len(set) > 1<<10 || strings.Contains(string(yaml)+set, "/") {
			return // bounded inputs; no paths outside the test's own dir
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(path, yaml, 0o644); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		c, _, err := Load(testReg, []string{path}, nil, []string{set})
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Load took %v", d)
		}
		if c == nil && err == nil {
			t.Fatal("Load returned neither a config nor an error")
		}
		if err != nil && strings.TrimSpace(err.Error()) == "" {
			t.Error("an empty error")
		}
	})
}
