package model

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// llamaConfig is a small valid Llama config.json with extra fields set.
func llamaConfig(extra string) string {
	return `{"architectures":["LlamaForCausalLM"],"hidden_size":64,"vocab_size":100,"max_position_embeddings":128,
		"num_attention_heads":4,"num_key_value_heads":2,"num_hidden_layers":2,"intermediate_size":128` + extra + `}`
}

// TestParseAbsurdSizes is the regression test of issue 24: a config.json
// stating an absurd size used to be trusted (num_hidden_layers 10^12
// appended layer specs until the host ran out of memory). Every size is
// now an error naming the field, the value and the limit, before any is
// used.
func TestParseAbsurdSizes(t *testing.T) {
	tests := []struct {
		name, extra, want string
	}{
		{"layers", `,"num_hidden_layers":1000000000000`, "config field num_hidden_layers is 1000000000000, above the limit 4096"},
		{"hidden", `,"hidden_size":1099511627776`, "config field hidden_size is 1099511627776, above the limit 1048576"},
		{"vocab", `,"vocab_size":4294967296`, "config field vocab_size is 4294967296, above the limit 16777216"},
		{"heads", `,"num_attention_heads":9999999`, "config field num_attention_heads is 9999999, above the limit 65536"},
		{"kvheads", `,"num_key_value_heads":-3`, "config field num_key_value_heads is -3, want >= 0"},
		{"headdim", `,"head_dim":70000`, "config field head_dim is 70000, above the limit 65536"},
		{"inter", `,"intermediate_size":9223372036854775807`, "config field intermediate_size is 9223372036854775807, above the limit 1048576"},
		{"positions", `,"max_position_embeddings":2000000000`, "config field max_position_embeddings is 2000000000, above the limit 1073741824"},
		{"experts", `,"num_experts":100000`, "config field num_experts is 100000, above the limit 65536"},
		{"lora", `,"kv_lora_rank":100000`, "config field kv_lora_rank is 100000, above the limit 65536"},
		{"mtp", `,"num_nextn_predict_layers":5000`, "config field num_nextn_predict_layers is 5000, above the limit 4096"},
		{"mtp+layers", `,"num_hidden_layers":4000,"num_nextn_predict_layers":100`, "config gives 4100 layers (4000 plus num_nextn_predict_layers 100), above the limit 4096"},
		{"width", `,"num_attention_heads":65536,"head_dim":65536`, "config fields num_attention_heads × head_dim are 4294967296, above the limit 16777216"},
		{"list", `,"layer_types":[` + strings.Repeat(`"full_attention",`, 5000) + `"full_attention"]`, "config field layer_types entries is 5001, above the limit 4096"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.name, []byte(llamaConfig(tt.extra)))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%s) = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

// TestParseAbsurdNemotronMTP: Nemotron-H's MTP layers are
// num_nextn_predict_layers copies of the MTP pattern; their product is
// bounded too.
func TestParseAbsurdNemotronMTP(t *testing.T) {
	cfg := `{"architectures":["NemotronHForCausalLM"],"hidden_size":64,"vocab_size":10,"max_position_embeddings":8,"num_attention_heads":4,
		"num_hidden_layers":2,"hybrid_override_pattern":"M*","mamba_num_heads":4,"mamba_head_dim":16,"ssm_state_size":8,"n_groups":1,"conv_kernel":4,
		"num_nextn_predict_layers":4000,"mtp_hybrid_override_pattern":"*-*-"}`
	_, err := Parse("nemo", []byte(cfg))
	want := "config gives 8002 layers (2 plus num_nextn_predict_layers × MTP pattern layers 8000), above the limit 4096"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Parse = %v, want an error containing %q", err, want)
	}
}

func TestLoadConfigTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.json")
	data := llamaConfig(`,"pad":"` + strings.Repeat("x", MaxConfigBytes) + `"`)
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), "larger than the 16777216-byte limit") {
		t.Fatalf("Load(big config) = %v, want the size limit named", err)
	}
}

// FuzzModelConfig writes arbitrary bytes as a config.json and loads it:
// Load must not panic, must return quickly with bounded memory, and a
// model it accepts must stay within the limits and fill its buffers
// without panicking.
func FuzzModelConfig(f *testing.F) {
	for _, glob := range []string{"../../device/hf/testdata/*/config.json", "presets/*.json"} {
		paths, _ := filepath.Glob(glob)
		for _, p := range paths {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(data)
			}
		}
	}
	f.Add([]byte(llamaConfig(`,"num_hidden_layers":1000000000000`)))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				panic(fmt.Sprintf("Load took over 5 s on %q", data))
			}
		}()
		path := filepath.Join(dir, "config.json")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := Load(path)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "model ") {
				t.Fatalf("Load error %q does not name the model", err)
			}
			return
		}
		if len(m.Layers) > MaxLayers {
			t.Fatalf("Load accepted %d layers, above MaxLayers %d", len(m.Layers), MaxLayers)
		}
		_ = FillBuffers(&m, Dtypes{}, 1)
		_ = ParamCount(m)
		_ = WeightBytes(m, 0, len(m.Layers)-1, "bf16", 1)
	})
}
