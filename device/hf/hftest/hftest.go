// Package hftest writes tiny random-weight Hugging Face checkpoints of the
// Llama family (Llama, Mistral, Qwen3) and runs them through Generate, a
// plain float64 re-implementation of transformers' forward that shares no
// code with package hf's model (only the safetensors reader), so that a
// test has an oracle before (and beside) transformers' own goldens.
package hftest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/kvx-dev/kvx/device/hf"
)

// Spec is a tiny checkpoint.
type Spec struct {
	Family                         string // llama, mistral, qwen3
	Hidden, Layers, Heads, KVHeads int
	HeadDim, Intermediate, Vocab   int
	MaxPosition                    int
	Window                         int  // sliding_window (mistral); 0 = none
	Tied                           bool // tie_word_embeddings
	Bias                           bool // attention_bias
	Theta                          float64
	Dtype                          string // F32 (default) or BF16
	Seed                           uint64
	// Std is the weights' standard deviation (initializer_range); 0 = 0.2.
	Std float64
	// Omit leaves this tensor out of the file; Extra adds a tensor of that
	// name (1 value): for the loader's error tests.
	Omit, Extra string
}

var archOf = map[string]string{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen3": "Qwen3ForCausalLM"}

// Write writes dir/config.json and dir/model.safetensors for s.
func Write(dir string, s Spec) error {
	arch, ok := archOf[s.Family]
	if !ok {
		return fmt.Errorf("hftest: family %q: want llama, mistral or qwen3", s.Family)
	}
	if s.Theta == 0 {
		s.Theta = 10000
	}
	if s.Std == 0 {
		s.Std = 0.2
	}
	dtype := "float32"
	if s.Dtype == "BF16" {
		dtype = "bfloat16"
	}
	cfg := map[string]any{
		"architectures": []string{arch}, "model_type": s.Family,
		"hidden_size": s.Hidden, "num_hidden_layers": s.Layers, "num_attention_heads": s.Heads,
		"num_key_value_heads": s.KVHeads, "head_dim": s.HeadDim, "intermediate_size": s.Intermediate,
		"vocab_size": s.Vocab, "max_position_embeddings": s.MaxPosition, "rms_norm_eps": 1e-6,
		"tie_word_embeddings": s.Tied, "attention_bias": s.Bias, "hidden_act": "silu", "dtype": dtype,
		"rope_parameters": map[string]any{"rope_type": "default", "rope_theta": s.Theta},
	}
	if s.Window > 0 {
		cfg["sliding_window"] = s.Window
	} else {
		cfg["sliding_window"] = nil
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x5afe))
	var ts []hf.Named
	add := func(name string, norm bool, shape ...int) {
		if name == s.Omit {
			return
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			if norm {
				v[i] = float32(1 + 0.1*rng.NormFloat64())
			} else {
				v[i] = float32(s.Std * rng.NormFloat64())
			}
		}
		ts = append(ts, hf.Named{Name: name, Shape: shape, Dtype: s.Dtype, Data: v})
	}
	h, d := s.Hidden, s.HeadDim
	add("model.embed_tokens.weight", false, s.Vocab, h)
	for i := range s.Layers {
		p := hf.LayerPrefix(i)
		add(p+"input_layernorm.weight", true, h)
		add(p+"self_attn.q_proj.weight", false, s.Heads*d, h)
		add(p+"self_attn.k_proj.weight", false, s.KVHeads*d, h)
		add(p+"self_attn.v_proj.weight", false, s.KVHeads*d, h)
		add(p+"self_attn.o_proj.weight", false, h, s.Heads*d)
		if s.Bias {
			add(p+"self_attn.q_proj.bias", false, s.Heads*d)
			add(p+"self_attn.k_proj.bias", false, s.KVHeads*d)
			add(p+"self_attn.v_proj.bias", false, s.KVHeads*d)
		}
		if s.Family == "qwen3" {
			add(p+"self_attn.q_norm.weight", true, d)
			add(p+"self_attn.k_norm.weight", true, d)
		}
		add(p+"post_attention_layernorm.weight", true, h)
		add(p+"mlp.gate_proj.weight", false, s.Intermediate, h)
		add(p+"mlp.up_proj.weight", false, s.Intermediate, h)
		add(p+"mlp.down_proj.weight", false, h, s.Intermediate)
	}
	add("model.norm.weight", true, h)
	if !s.Tied {
		add("lm_head.weight", false, s.Vocab, h)
	}
	if s.Extra != "" {
		ts = append(ts, hf.Named{Name: s.Extra, Shape: []int{1}, Data: []float32{1}})
	}
	return hf.WriteSafetensors(filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"})
}

// model is a checkpoint in float64 for Generate.
type model struct {
	hidden, layers, heads, kvh, d, inter, vocab, window int
	eps, theta                                          float64
	qkNorm                                              bool
	w                                                   map[string][]float64
}

func load(dir string) (*model, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var c struct {
		ModelType     string   `json:"model_type"`
		Hidden        int      `json:"hidden_size"`
		Layers        int      `json:"num_hidden_layers"`
		Heads         int      `json:"num_attention_heads"`
		KVHeads       int      `json:"num_key_value_heads"`
		HeadDim       int      `json:"head_dim"`
		Inter         int      `json:"intermediate_size"`
		Vocab         int      `json:"vocab_size"`
		Eps           float64  `json:"rms_norm_eps"`
		Tied          bool     `json:"tie_word_embeddings"`
		Window        *int     `json:"sliding_window"`
		UseWindow     *bool    `json:"use_sliding_window"`
		RopeTheta     *float64 `json:"rope_theta"`
		RopeParameter struct {
			Type  string   `json:"rope_type"`
			Theta *float64 `json:"rope_theta"`
		} `json:"rope_parameters"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	if t := c.RopeParameter.Type; t != "" && t != "default" {
		return nil, fmt.Errorf("hftest: rope_type %q: the reference runs default RoPE", t)
	}
	m := &model{hidden: c.Hidden, layers: c.Layers, heads: c.Heads, kvh: c.KVHeads, d: c.HeadDim, inter: c.Inter, vocab: c.Vocab,
		eps: c.Eps, theta: 10000, qkNorm: c.ModelType == "qwen3", w: map[string][]float64{}}
	if m.kvh == 0 {
		m.kvh = m.heads
	}
	if m.d == 0 {
		m.d = m.hidden / m.heads
	}
	if c.Window != nil && (c.UseWindow == nil || *c.UseWindow) {
		m.window = *c.Window
	}
	switch {
	case c.RopeParameter.Theta != nil:
		m.theta = *c.RopeParameter.Theta
	case c.RopeTheta != nil:
		m.theta = *c.RopeTheta
	}
	ck, err := hf.OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		shape := make([]int, len(info.Shape))
		for i, v := range info.Shape {
			shape[i] = int(v)
		}
		f, err := ck.Float32(name, shape...)
		if err != nil {
			return nil, err
		}
		w := make([]float64, len(f))
		for i, v := range f {
			w[i] = float64(v)
		}
		m.w[name] = w
	}
	if c.Tied {
		m.w["lm_head.weight"] = m.w["model.embed_tokens.weight"]
	}
	return m, nil
}

func matvec(w, x []float64, b []float64) []float64 {
	n := len(x)
	out := make([]float64, len(w)/n)
	for r := range out {
		s := 0.0
		for i, v := range x {
			s += w[r*n+i] * v
		}
		if b != nil {
			s += b[r]
		}
		out[r] = s
	}
	return out
}

func rmsnorm(x, g []float64, eps float64) []float64 {
	s := 0.0
	for _, v := range x {
		s += v * v
	}
	inv := 1 / math.Sqrt(s/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * inv * g[i]
	}
	return out
}

// rope rotates every head of x (rotate-half layout) for position pos.
func (m *model) rope(x []float64, pos int) {
	half := m.d / 2
	for h := 0; h < len(x); h += m.d {
		for i := range half {
			a := float64(pos) * math.Pow(m.theta, -float64(2*i)/float64(m.d))
			c, s := math.Cos(a), math.Sin(a)
			x0, x1 := x[h+i], x[h+i+half]
			x[h+i], x[h+i+half] = x0*c-x1*s, x1*c+x0*s
		}
	}
}

// Generate greedily generates n tokens after prompt with the checkpoint in
// dir, recomputing the whole sequence in float64 at every step, and returns
// them with each step's log-softmax over the vocabulary.
func Generate(dir string, prompt []int32, n int) ([]int32, [][]float64, error) {
	m, err := load(dir)
	if err != nil {
		return nil, nil, err
	}
	seq := append([]int32(nil), prompt...)
	var out []int32
	var lps [][]float64
	for range n {
		lg := m.forward(seq)
		mx := math.Inf(-1)
		best := 0
		for i, v := range lg {
			if v > mx {
				mx, best = v, i
			}
		}
		z := 0.0
		for _, v := range lg {
			z += math.Exp(v - mx)
		}
		lp := make([]float64, len(lg))
		for i, v := range lg {
			lp[i] = v - mx - math.Log(z)
		}
		seq = append(seq, int32(best))
		out = append(out, int32(best))
		lps = append(lps, lp)
	}
	return out, lps, nil
}

// forward returns the logits after the last token of seq.
func (m *model) forward(seq []int32) []float64 {
	T, H, D := len(seq), m.hidden, m.d
	x := make([][]float64, T)
	emb := m.w["model.embed_tokens.weight"]
	for t, tok := range seq {
		x[t] = append([]float64(nil), emb[int(tok)*H:(int(tok)+1)*H]...)
	}
	G := m.heads / m.kvh
	for l := range m.layers {
		p := hf.LayerPrefix(l)
		w := func(n string) []float64 { return m.w[p+n] }
		q, k, v := make([][]float64, T), make([][]float64, T), make([][]float64, T)
		for t := range T {
			in := rmsnorm(x[t], w("input_layernorm.weight"), m.eps)
			q[t] = matvec(w("self_attn.q_proj.weight"), in, w("self_attn.q_proj.bias"))
			k[t] = matvec(w("self_attn.k_proj.weight"), in, w("self_attn.k_proj.bias"))
			v[t] = matvec(w("self_attn.v_proj.weight"), in, w("self_attn.v_proj.bias"))
			if m.qkNorm {
				for h := 0; h < len(q[t]); h += D {
					copy(q[t][h:h+D], rmsnorm(q[t][h:h+D], w("self_attn.q_norm.weight"), m.eps))
				}
				for h := 0; h < len(k[t]); h += D {
					copy(k[t][h:h+D], rmsnorm(k[t][h:h+D], w("self_attn.k_norm.weight"), m.eps))
				}
			}
			m.rope(q[t], t)
			m.rope(k[t], t)
		}
		for t := range T {
			att := make([]float64, m.heads*D)
			lo := 0
			if m.window > 0 && t-m.window+1 > 0 {
				lo = t - m.window + 1
			}
			for h := range m.heads {
				kh := h / G
				s := make([]float64, t+1-lo)
				mx := math.Inf(-1)
				for j := lo; j <= t; j++ {
					dot := 0.0
					for i := range D {
						dot += q[t][h*D+i] * k[j][kh*D+i]
					}
					s[j-lo] = dot / math.Sqrt(float64(D))
					mx = math.Max(mx, s[j-lo])
				}
				z := 0.0
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					z += s[j]
				}
				for j := lo; j <= t; j++ {
					for i := range D {
						att[h*D+i] += s[j-lo] / z * v[j][kh*D+i]
					}
				}
			}
			o := matvec(w("self_attn.o_proj.weight"), att, w("self_attn.o_proj.bias"))
			for i := range x[t] {
				x[t][i] += o[i]
			}
			post := rmsnorm(x[t], w("post_attention_layernorm.weight"), m.eps)
			g := matvec(w("mlp.gate_proj.weight"), post, nil)
			u := matvec(w("mlp.up_proj.weight"), post, nil)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			dn := matvec(w("mlp.down_proj.weight"), g, nil)
			for i := range x[t] {
				x[t][i] += dn[i]
			}
		}
	}
	last := rmsnorm(x[T-1], m.w["model.norm.weight"], m.eps)
	return matvec(m.w["lm_head.weight"], last, nil)
}
