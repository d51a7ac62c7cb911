package model

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// A checkpoint whose config.json lists MTP layers but whose weights hold
// none (deepseek_v3's golden: num_nextn_predict_layers 1) loads without
// them; an index naming the MTP layer's tensors keeps them, and
// CheckpointMTPLayers counts the same. The DSA
// indexer keys of a checkpoint are unquantized at the KV dtype.
func TestCheckpointMTPAndIndexKeys(t *testing.T) {
	src := filepath.Join("..", "..", "device", "hf", "testdata", "deepseek_v3")
	m, err := Load(src)
	if err != nil {
		t.Fatal(err)
	}
	if m.NumNextN != 0 || len(m.Layers) != 3 {
		t.Errorf("Load(%s): %d MTP layers of %d, want 0 of 3 (the file has no model.layers.3.*)", src, m.NumNextN, len(m.Layers))
	}
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	index := `{"weight_map": {"model.embed_tokens.weight": "a.safetensors", "model.layers.3.eh_proj.weight": "a.safetensors"}}`
	for name, body := range map[string][]byte{"config.json": data, "model.safetensors.index.json": []byte(index)} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if mt, err := Load(dir); err != nil || mt.NumNextN != 1 || len(mt.Layers) != 4 || !mt.Layers[3].MTP {
		t.Errorf("Load(index with model.layers.3.*) = %d MTP of %d layers, %v; want 1 of 4", mt.NumNextN, len(mt.Layers), err)
	}
	// The MTP layers a checkpoint holds, whatever a model runs of them.
	for _, c := range []struct {
		dir  string
		want int
	}{{src, 0}, {dir, 1}} {
		if n, err := CheckpointMTPLayers(c.dir); n != c.want || err != nil {
			t.Errorf("CheckpointMTPLayers(%s) = %d, %v; want %d", c.dir, n, err, c.want)
		}
	}
	if _, err := CheckpointMTPLayers(t.TempDir()); err == nil {
		t.Errorf("CheckpointMTPLayers(an empty directory) = nil error, want config.json's")
	}

	v32, err := Load(filepath.Join("..", "..", "device", "hf", "testdata", "deepseek_v32"))
	if err != nil {
		t.Fatal(err)
	}
	synthetic := v32
	synthetic.Checkpoint = ""
	for _, c := range []struct {
		m    spec.Model
		kv   string
		want int64
	}{{v32, "float32", 16 * 4}, {v32, "bf16", 16 * 2}, {synthetic, "float32", 16 + 4}} {
		mm := c.m
		mm.Layers = append([]spec.Layer(nil), c.m.Layers...)
		if err := FillBuffers(&mm, Dtypes{KV: c.kv}, 1); err != nil {
			t.Fatal(err)
		}
		var got int64
		for _, b := range mm.Layers[0].Buffers {
			if b.Role == spec.RoleIndexKey {
				got = b.BytesPerToken
			}
		}
		if got != c.want {
			t.Errorf("checkpoint %v, kv %s: index key %d bytes per token, want %d", mm.Checkpoint != "", c.kv, got, c.want)
		}
	}
}
