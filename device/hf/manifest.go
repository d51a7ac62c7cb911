package hf

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/model"
)

// manifest is every tensor one architecture's checkpoint must hold and
// those it may hold, each with its shape, and the reader that puts them on
// the device. Each architecture's New declares its tensors (need, allow,
// linear, ends), checks the checkpoint once (check), then loads (host,
// load, lin, loadEnds) and returns err at the end: the rule "a missing,
// extra or mis-shaped tensor is an error that names it" lives here, for
// every architecture.
// A declared tensor stored in fp8 (F8_E4M3, F8_E5M2) brings its block
// scales ScaleName(name) with it: they are expected, never extra, their
// shape is checked with the weight's, and host dequantizes the weight with
// them at load (fp8.go), so the model code never sees fp8.
// A manifest is not safe for concurrent use.
type manifest struct {
	ck        *Checkpoint
	ops       synth.Loader
	quant     *model.Quant     // config.json's quantization_config; nil: none
	want, may map[string][]int // name -> shape
	lerr      error            // the first read error of host
}

// openManifest opens the checkpoint in dir (OpenCheckpoint's errors,
// prefixed "hf: ") for an empty manifest whose loads go onto ops; quant is
// the checkpoint's quantization_config (nil: none). The caller closes it.
func openManifest(dir string, ops synth.Loader, quant *model.Quant) (*manifest, error) {
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	return &manifest{ck: ck, ops: ops, quant: quant, want: map[string][]int{}, may: map[string][]int{}}, nil
}

// declared returns the declared shape of name (needed or allowed).
func (t *manifest) declared(name string) ([]int, bool) {
	if shape, ok := t.want[name]; ok {
		return shape, true
	}
	shape, ok := t.may[name]
	return shape, ok
}

// checkScale checks the block scales of tensor name (shape shape), which
// the checkpoint holds: none are needed unless it is fp8; then the
// checkpoint must have a quantization_config, the tensor must be 2-D, and
// ScaleName(name) must be there with shape [ceil(rows/br), ceil(cols/bc)].
func (t *manifest) checkScale(name string, shape []int) error {
	info, _ := t.ck.Info(name)
	if !isFP8(info.Dtype) {
		return nil
	}
	dir, sn := t.ck.dir, ScaleName(name)
	switch {
	case t.quant == nil:
		return fmt.Errorf("hf: checkpoint %s: tensor %q is %s, but config.json has no quantization_config (quant_method fp8, weight_block_size)", dir, name, info.Dtype)
	case len(shape) != 2:
		return fmt.Errorf("hf: checkpoint %s: tensor %q is %s with shape %v: block scales cover 2-D weights only", dir, name, info.Dtype, shape)
	}
	want := scaleShape(shape[0], shape[1], t.quant.BlockSize)
	si, ok := t.ck.Info(sn)
	if !ok {
		return fmt.Errorf("hf: checkpoint %s: tensor %q is missing: the %s tensor %q needs its block scales (want shape %v for weight_block_size %v)", dir, sn, info.Dtype, name, want, t.quant.BlockSize)
	}
	if !slices.Equal(si.Shape, toInt64(want)) {
		return fmt.Errorf("hf: checkpoint %s: tensor %q has shape %v, want %v (the block scales of %q %v, weight_block_size %v)", dir, sn, si.Shape, want, name, shape, t.quant.BlockSize)
	}
	return nil
}

// close unmaps the checkpoint; tensors already loaded stay valid.
func (t *manifest) close() { t.ck.Close() }

// need declares a tensor the checkpoint must hold, with its shape.
func (t *manifest) need(name string, shape ...int) { t.want[name] = shape }

// allow declares a tensor the checkpoint may hold, with its shape when it
// does (lm_head.weight of a tied model).
func (t *manifest) allow(name string, shape ...int) { t.may[name] = shape }

// linear needs name.weight (out × in) and, when bias, name.bias (out).
func (t *manifest) linear(name string, out, in int, bias bool) {
	t.need(name+".weight", out, in)
	if bias {
		t.need(name+".bias", out)
	}
}

// ends declares the two ends of a decoder: the embedding table embed
// (v × h), the final norm norm (h) and the LM head lm_head.weight (v × h),
// needed unless tied, when it is only allowed (and never read: the
// embedding table is the head).
func (t *manifest) ends(embed, norm string, v, h int, tied bool) {
	t.need(embed, v, h)
	t.need(norm, h)
	if tied {
		t.allow("lm_head.weight", v, h)
	} else {
		t.need("lm_head.weight", v, h)
	}
}

// loadEnds loads the ends stage s runs (see ends): the embedding table on
// the first stage and, when tied, on the last; the final norm and the LM
// head on the last.
func (t *manifest) loadEnds(s *Stage, embed, norm string) { t.loadEndsWith(s, embed, norm, t.load) }

// loadEndsWith is loadEnds with the final norm's gains loaded by loadNorm
// (Qwen3-Next's zero-centred norm: 1 + w).
func (t *manifest) loadEndsWith(s *Stage, embed, norm string, loadNorm func(string) synth.Tensor) {
	isLast := s.last == len(s.m.Layers)
	if s.first == 0 || (isLast && s.cfg.Tied) {
		s.embed = t.load(embed)
	}
	if isLast {
		s.finalNorm = loadNorm(norm)
		if s.cfg.Tied {
			s.lmHead = s.embed
		} else {
			s.lmHead = t.load("lm_head.weight")
		}
	}
}

// check fails, naming the checkpoint directory and the tensor, when the
// checkpoint holds a tensor neither needed nor allowed (not one of arch
// with layers layers), lacks a needed one, or holds one of either with
// another shape. Names are checked in sorted order (extra ones first, then
// the needed, then the allowed), so of several bad tensors the same one is
// named every time.
func (t *manifest) check(arch string, layers int) error {
	dir := t.ck.dir
	for _, name := range t.ck.Names() {
		if _, ok := t.want[name]; ok {
			continue
		}
		if _, ok := t.may[name]; ok {
			continue
		}
		info, _ := t.ck.Info(name)
		if base, ok := strings.CutSuffix(name, "_scale_inv"); ok {
			if _, ok := t.declared(base); ok {
				if bi, ok := t.ck.Info(base); ok && !isFP8(bi.Dtype) {
					return fmt.Errorf("hf: checkpoint %s: tensor %q holds block scales of %q, which is %s, not fp8", dir, name, base, bi.Dtype)
				}
				continue // checked with its weight below (or the weight is reported missing)
			}
		}
		return fmt.Errorf("hf: checkpoint %s: tensor %q (shape %v) is not a tensor of %s with %d layers", dir, name, info.Shape, arch, layers)
	}
	for _, name := range slices.Sorted(maps.Keys(t.want)) {
		shape := t.want[name]
		info, ok := t.ck.Info(name)
		if !ok {
			return fmt.Errorf("hf: checkpoint %s: tensor %q is missing (want shape %v)", dir, name, shape)
		}
		if !slices.Equal(info.Shape, toInt64(shape)) {
			return fmt.Errorf("hf: checkpoint %s: tensor %q has shape %v, want %v", dir, name, info.Shape, shape)
		}
		if err := t.checkScale(name, shape); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(t.may)) {
		shape := t.may[name]
		info, ok := t.ck.Info(name)
		if !ok {
			continue
		}
		if !slices.Equal(info.Shape, toInt64(shape)) {
			return fmt.Errorf("hf: checkpoint %s: tensor %q has shape %v, want %v", dir, name, info.Shape, shape)
		}
		if err := t.checkScale(name, shape); err != nil {
			return err
		}
	}
	return nil
}

// shape returns the declared shape of name, ok false when name is not
// declared or is an allowed tensor the checkpoint does not hold.
func (t *manifest) shape(name string) ([]int, bool) {
	if shape, ok := t.want[name]; ok {
		return shape, true
	}
	shape, ok := t.may[name]
	return shape, ok && t.ck.Has(name)
}

// host returns tensor name in float32 on the host, or nil when it is not
// declared, is an absent allowed one, or fails to read (err keeps the
// first such error). An fp8 tensor is dequantized here with its block
// scales, to float32, the compute dtype Ops.Weight takes.
func (t *manifest) host(name string) []float32 {
	shape, ok := t.shape(name)
	if !ok {
		return nil
	}
	var data []float32
	var err error
	if info, _ := t.ck.Info(name); isFP8(info.Dtype) && t.quant != nil {
		data, err = t.ck.Dequantize(name, t.quant.BlockSize, shape...)
	} else {
		data, err = t.ck.Float32(name, shape...)
	}
	if err != nil {
		if t.lerr == nil {
			t.lerr = err
		}
		return nil
	}
	return data
}

// BF16Loader is an optional interface of a synth.Loader whose device keeps
// some weights in bf16 (the cuda device's fast numerics): a bf16 tensor of
// the checkpoint goes to it as its bytes, with no float32 copy on the host.
type BF16Loader interface {
	// WeightBF16 makes a rows × cols weight of raw, little-endian bf16
	// values row-major (raw is only read, during the call), and reports
	// whether it did: false when the device keeps that weight in float32
	// (the loader then calls Weight).
	WeightBF16(raw []byte, rows, cols int) (synth.Tensor, bool)
}

// load puts tensor name on the device as shape[0] × (the rest), a 1-D one
// as 1 × n; nil where host returns nil. A bf16 tensor goes as its bytes to
// a BF16Loader that takes it.
func (t *manifest) load(name string) synth.Tensor {
	shape, ok := t.shape(name)
	if !ok {
		return nil
	}
	rows, cols := 1, 1
	for i, d := range shape {
		if i == 0 && len(shape) > 1 {
			rows = d
		} else {
			cols *= d
		}
	}
	if bl, ok := t.ops.(BF16Loader); ok {
		raw, isBF16, err := t.ck.BF16(name, shape...)
		if err != nil {
			if t.lerr == nil {
				t.lerr = err
			}
			return nil
		}
		if isBF16 {
			if w, ok := bl.WeightBF16(raw, rows, cols); ok {
				return w
			}
		}
	}
	data := t.host(name)
	if data == nil {
		return nil
	}
	return t.ops.Weight(data, rows, cols)
}

// lin loads name.weight and name.bias (nil when not declared or absent).
func (t *manifest) lin(name string) linear {
	return linear{w: t.load(name + ".weight"), b: t.load(name + ".bias")}
}

// err returns the first read error of host and load, prefixed "hf: ".
func (t *manifest) err() error {
	if t.lerr != nil {
		return fmt.Errorf("hf: %w", t.lerr)
	}
	return nil
}
