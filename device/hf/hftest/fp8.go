package hftest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvx-dev/kvx/device/hf"
)

// FP8Weight reports whether tensor name of shape shape is one DeepSeek-V3
// stores in fp8: a 2-D projection weight (q/kv/o projections, the dense
// and expert MLPs); the embedding table, the LM head, the router and the
// norms stay in the checkpoint's dtype.
func FP8Weight(name string, shape []int64) bool {
	return len(shape) == 2 && strings.HasSuffix(name, ".weight") && strings.Contains(name, "_proj")
}

// FP8Tensors reads the single-file checkpoint in src and returns its
// tensors twice, in name order: fp8, where every FP8Weight tensor is
// quantized by hf.QuantizeFP8 in blocks of block (F8_E4M3, followed by its
// float32 _scale_inv), and f32, where the same weights are dequantized (q
// × scale of its block, one float32 multiply) as F32; with src's
// config.json and that config plus quantization_config {quant_method fp8,
// fmt e4m3, weight_block_size block}, and the number of tensors quantized.
func FP8Tensors(src string, block [2]int) (fp8, f32 []hf.Named, cfg, qcfg map[string]any, n int, err error) {
	data, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return nil, nil, nil, nil, 0, err
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, nil, nil, nil, 0, fmt.Errorf("%s/config.json: %w", src, err)
	}
	if err := json.Unmarshal(data, &qcfg); err != nil {
		return nil, nil, nil, nil, 0, err
	}
	qcfg["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": block[:]}
	ck, err := hf.OpenCheckpoint(src)
	if err != nil {
		return nil, nil, nil, nil, 0, err
	}
	defer ck.Close()
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		shape := make([]int, len(info.Shape))
		for i, d := range info.Shape {
			shape[i] = int(d)
		}
		v, err := ck.Float32(name, shape...)
		if err != nil {
			return nil, nil, nil, nil, 0, err
		}
		if !FP8Weight(name, info.Shape) {
			fp8 = append(fp8, hf.Named{Name: name, Shape: shape, Data: v})
			f32 = append(f32, hf.Named{Name: name, Shape: shape, Data: v})
			continue
		}
		w, s, err := hf.QuantizeFP8(name, shape[0], shape[1], v, block)
		if err != nil {
			return nil, nil, nil, nil, 0, err
		}
		deq := make([]float32, len(w.Data))
		for r := range shape[0] {
			for c := range shape[1] {
				deq[r*shape[1]+c] = w.Data[r*shape[1]+c] * s.Data[(r/block[0])*s.Shape[1]+c/block[1]]
			}
		}
		fp8 = append(fp8, w, s)
		f32 = append(f32, hf.Named{Name: name, Shape: shape, Data: deq})
		n++
	}
	return fp8, f32, cfg, qcfg, n, nil
}

// WriteCheckpoint writes dir/config.json (cfg) and dir/model.safetensors
// (tensors).
func WriteCheckpoint(dir string, cfg map[string]any, tensors []hf.Named) error {
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		return err
	}
	return hf.WriteSafetensors(filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"})
}

// WriteFP8 writes the two checkpoints of FP8Tensors(src, block): the fp8
// one in fp8Dir, the dequantized float32 one in f32Dir (other files of src
// are not copied). It returns the number of tensors quantized.
func WriteFP8(src, fp8Dir, f32Dir string, block [2]int) (int, error) {
	fp8, f32, cfg, qcfg, n, err := FP8Tensors(src, block)
	if err != nil {
		return 0, err
	}
	if err := WriteCheckpoint(fp8Dir, qcfg, fp8); err != nil {
		return 0, err
	}
	return n, WriteCheckpoint(f32Dir, cfg, f32)
}
