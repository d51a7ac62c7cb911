// Package kernelspec holds what a kernel computes, device by device the
// same: the shapes of the paged attention kernels (GQA with its window, MLA
// in absorbed form, DSA's indexer and sparse MLA) and of the recurrent
// mixers (Mamba2, Gated DeltaNet), their cache dtypes, their row and state
// layouts (RowBytes, ConvBytes, SSMBytes: what plugins/model.FillBuffers
// sizes pools with) and their order of operations, written once on each
// type. device/cpu/kernel computes them in pure Go (the reference) and
// device/cuda on the GPU; device/paged builds a layer's specs from the
// model for both. This package computes nothing: a device that runs a spec
// states it in terms of these types, and its tests compare it with the cpu
// reference.
//
// Validate checks a spec's dimensions; its errors wrap ErrInvalid and name
// the field, the value and the limit.
package kernelspec

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every validation error of a kernel, on any
// device.
var ErrInvalid = errors.New("kernel: invalid argument")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// Dtype is the element type of a cache buffer.
type Dtype uint8

const (
	// BF16 is bfloat16, 2 bytes, rounded to nearest even (see BF16FromFloat32).
	BF16 Dtype = iota
	// FP8 is OCP float8 e4m3fn, 1 byte, saturating (see FP8FromFloat32).
	FP8
	// F32 is float32, 4 bytes, exact.
	F32
)

// Size returns the bytes of one element.
func (d Dtype) Size() int {
	switch d {
	case BF16:
		return 2
	case FP8:
		return 1
	case F32:
		return 4
	}
	return 0
}

func (d Dtype) String() string {
	switch d {
	case BF16:
		return "bf16"
	case FP8:
		return "fp8"
	case F32:
		return "float32"
	}
	return fmt.Sprintf("Dtype(%d)", uint8(d))
}

func (d Dtype) valid() bool { return d <= F32 }

// ParseDtype maps a cache dtype name of the engine config (plugins/model's
// KVBytes and StateBytes names) to a Dtype. "auto" is the caller's business:
// pass what it resolves to.
func ParseDtype(name string) (Dtype, error) {
	switch name {
	case "bf16", "bfloat16":
		return BF16, nil
	case "fp8":
		return FP8, nil
	case "float32", "fp32":
		return F32, nil
	}
	return 0, invalidf("dtype %q: allowed bf16, bfloat16, fp8, float32, fp32", name)
}

// RoPE is rotary position embedding over the first Dim elements of each head.
// Theta 0 disables it (the kernels then leave q and k as they come), for callers that rotate themselves.
type RoPE struct {
	Dim   int     // rotated elements per head (even); the rest pass through
	Theta float64 // base (rope_theta), e.g. 10000
	// Interleaved rotates pairs (x[2i], x[2i+1]) (GPT-J, DeepSeek's
	// reference code); false rotates (x[i], x[i+Dim/2]) (GPT-NeoX, HF Llama).
	Interleaved bool
	// InvFreq, when set, holds the Dim/2 frequencies (radians per position)
	// in place of Theta^(-2i/Dim): the scaled RoPE variants (llama3, yarn)
	// compute them from the checkpoint's rope parameters. Theta is then
	// ignored. The caller must not modify it.
	InvFreq []float64
	// Scale, when not 0, multiplies every cosine and sine before they are
	// rounded to float32 (yarn's attention factor).
	Scale float64
}

func (r RoPE) On() bool { return (r.Theta != 0 || len(r.InvFreq) > 0) && r.Dim > 0 }

func (r RoPE) validate(name string, headDim int) error {
	if !r.On() {
		return nil
	}
	if r.Dim%2 != 0 || r.Dim > headDim {
		return invalidf("%s: rope dim %d must be even and <= %d", name, r.Dim, headDim)
	}
	if len(r.InvFreq) > 0 && len(r.InvFreq) != r.Dim/2 {
		return invalidf("%s: %d rope frequencies, want dim/2 = %d", name, len(r.InvFreq), r.Dim/2)
	}
	return nil
}
