package hftest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kvx-dev/kvx/device/hf"
)

// MTPSpec are the MTP layers MTPTensors gives a DeepSeek checkpoint.
type MTPSpec struct {
	Layers int // num_nextn_predict_layers, >= 1
	Seed   uint64
	// Std is the random weights' standard deviation; 0: the config's
	// initializer_range (0.2 when it has none).
	Std float64
	// Shared adds each layer's embed_tokens and shared_head.head as copies
	// of the model's embed_tokens and lm_head, as DeepSeek-V3's own
	// checkpoint stores them.
	Shared bool
	// Quiet, when > 0, makes a model whose drafts are mostly accepted:
	// every decoder layer's o_proj and MLP down projections (the main
	// model's and the MTP layers') are scaled by Quiet, so the next token
	// is mostly a function of the last one (the LM head of its normed
	// embedding), and each MTP layer drafts that function of its input
	// token (eh_proj passes the token's half, enorm is model.norm's
	// gains, shared_head.norm is ones), which the main model then
	// mostly confirms. Attention still reads the caches, at Quiet's weight.
	Quiet float64
}

// MTPTensors returns the tensors of the single-file DeepSeek checkpoint src
// (in name order) followed by those of s.Layers MTP layers, and src's
// config.json with num_nextn_predict_layers set to s.Layers. MTP layer N
// (num_hidden_layers, num_hidden_layers+1, ...) gets enorm, hnorm, eh_proj
// (hidden × 2·hidden) and shared_head.norm (and, with Shared, embed_tokens
// and shared_head.head), and a decoder block shaped as src's last decoder
// layer's (its model.layers.<num_hidden_layers-1>.* renamed), all random,
// as scripts/hf_goldens.py draws the goldens' weights: 1-D norm weights
// 1 + 0.1·N(0,1), their biases 0.1·N(0,1), e_score_correction_bias
// 0.05·N(0,1), every other tensor N(0, Std²).
func MTPTensors(src string, s MTPSpec) ([]hf.Named, map[string]any, error) {
	if s.Layers < 1 {
		return nil, nil, fmt.Errorf("hftest: %d MTP layers, want >= 1", s.Layers)
	}
	data, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return nil, nil, err
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, nil, fmt.Errorf("%s/config.json: %w", src, err)
	}
	layers, ok1 := cfg["num_hidden_layers"].(float64)
	hidden, ok2 := cfg["hidden_size"].(float64)
	if !ok1 || !ok2 || layers < 1 || hidden < 1 {
		return nil, nil, fmt.Errorf("%s/config.json: num_hidden_layers %v, hidden_size %v: want numbers >= 1", src, cfg["num_hidden_layers"], cfg["hidden_size"])
	}
	std := s.Std
	if std == 0 {
		std = 0.2
		if r, ok := cfg["initializer_range"].(float64); ok && r > 0 {
			std = r
		}
	}
	cfg["num_nextn_predict_layers"] = s.Layers
	ck, err := hf.OpenCheckpoint(src)
	if err != nil {
		return nil, nil, err
	}
	defer ck.Close()
	read := func(name string) (hf.Named, error) {
		info, _ := ck.Info(name)
		shape := make([]int, len(info.Shape))
		for i, d := range info.Shape {
			shape[i] = int(d)
		}
		v, err := ck.Float32(name, shape...)
		return hf.Named{Name: name, Shape: shape, Data: v}, err
	}
	var out []hf.Named
	byName := map[string]hf.Named{}
	for _, name := range ck.Names() {
		t, err := read(name)
		if err != nil {
			return nil, nil, err
		}
		if s.Quiet > 0 && quieted(name) {
			for i := range t.Data {
				t.Data[i] *= float32(s.Quiet)
			}
		}
		out = append(out, t)
		byName[name] = t
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x3a7b))
	random := func(name string, shape ...int) hf.Named {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			switch {
			case strings.HasSuffix(name, "e_score_correction_bias"):
				v[i] = float32(0.05 * rng.NormFloat64())
			case len(shape) == 1 && strings.HasSuffix(name, ".bias"):
				v[i] = float32(0.1 * rng.NormFloat64())
			case len(shape) == 1 && strings.Contains(name, "norm"):
				v[i] = float32(1 + 0.1*rng.NormFloat64())
			default:
				v[i] = float32(std * rng.NormFloat64())
			}
		}
		if s.Quiet > 0 && quieted(name) {
			for i := range v {
				v[i] *= float32(s.Quiet)
			}
		}
		return hf.Named{Name: name, Shape: shape, Data: v}
	}
	last := "model.layers." + strconv.Itoa(int(layers)-1) + "."
	h := int(hidden)
	for k := range s.Layers {
		p := "model.layers." + strconv.Itoa(int(layers)+k) + "."
		enorm, eh, headNorm := random(p+"enorm.weight", h), random(p+"eh_proj.weight", h, 2*h), random(p+"shared_head.norm.weight", h)
		if s.Quiet > 0 {
			norm, ok := byName["model.norm.weight"]
			if !ok {
				return nil, nil, fmt.Errorf("hftest: checkpoint %s has no model.norm.weight", src)
			}
			enorm.Data = slices.Clone(norm.Data)
			clear(eh.Data)
			for r := range h {
				eh.Data[r*2*h+r] = 1
			}
			for i := range headNorm.Data {
				headNorm.Data[i] = 1
			}
		}
		out = append(out, enorm, random(p+"hnorm.weight", h), eh, headNorm)
		if s.Shared {
			for _, c := range [][2]string{{"model.embed_tokens.weight", "embed_tokens.weight"}, {"lm_head.weight", "shared_head.head.weight"}} {
				t, ok := byName[c[0]]
				if !ok {
					return nil, nil, fmt.Errorf("hftest: checkpoint %s has no %s to copy", src, c[0])
				}
				out = append(out, hf.Named{Name: p + c[1], Shape: t.Shape, Data: t.Data})
			}
		}
		for _, name := range ck.Names() {
			if rest, ok := strings.CutPrefix(name, last); ok {
				out = append(out, random(p+rest, byName[name].Shape...))
			}
		}
	}
	return out, cfg, nil
}

// quieted reports whether MTPSpec.Quiet scales tensor name: a decoder
// layer's o_proj or MLP down projection (dense, routed or shared).
func quieted(name string) bool {
	return strings.HasPrefix(name, "model.layers.") &&
		(strings.HasSuffix(name, ".self_attn.o_proj.weight") || strings.HasSuffix(name, ".down_proj.weight"))
}

// WriteMTP writes MTPTensors(src, s) as the checkpoint dir (config.json and
// model.safetensors; other files of src are not copied).
func WriteMTP(src, dir string, s MTPSpec) error {
	ts, cfg, err := MTPTensors(src, s)
	if err != nil {
		return err
	}
	return WriteCheckpoint(dir, cfg, ts)
}
