package hf

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// FP8 weights with block scales, as DeepSeek-V3 checkpoints store them
// (quantization_config quant_method "fp8", weight_block_size [br, bc]):
// X.weight is F8_E4M3 (rows × cols) and X.weight_scale_inv is float32 of
// shape [ceil(rows/br), ceil(cols/bc)]; the weight is fp8 value ×
// scale_inv of its block.
//
// kvx dequantizes at load, to the compute dtype of the device (float32 on
// the cpu device: Ops.Weight takes float32), in one float32 multiply per
// element, and the matmuls then run on those weights as on any float32
// checkpoint; so do transformers' FineGrainedFP8 models loaded with
// dequantize=True. The native fp8 GEMM path (activations quantized per
// token group at run time, activation_scheme "dynamic") is not reproduced.

// e4m3Table and e5m2Table are the float32 value of every fp8 bit pattern.
var e4m3Table, e5m2Table = func() (a, b [256]float32) {
	for i := range 256 {
		a[i] = decodeE4M3(uint8(i))
		b[i] = F16ToFloat32(uint16(i) << 8)
	}
	return
}()

// decodeE4M3 is the OCP FP8 E4M3 ("e4m3fn") decoding: sign, 4 exponent bits
// with bias 7, 3 mantissa bits; exponent 0 is subnormal (m/8 · 2^-6); no
// infinities; S.1111.111 (0x7f, 0xff) is NaN, so the largest value is 448.
func decodeE4M3(b uint8) float32 {
	sign := uint32(b>>7) << 31
	exp := uint32(b>>3) & 0xf
	mant := uint32(b) & 7
	switch {
	case exp == 0xf && mant == 7:
		return math.Float32frombits(sign | 0x7fc00000)
	case exp == 0: // subnormal: mant · 2^-9, exact in float32
		return math.Float32frombits(sign | math.Float32bits(float32(mant)*(1.0/512)))
	}
	return math.Float32frombits(sign | (exp+127-7)<<23 | mant<<20)
}

// E4M3ToFloat32 converts OCP FP8 E4M3 bits to float32, exactly (see
// decodeE4M3: bias 7, subnormals, no infinities, 0x7f and 0xff NaN).
func E4M3ToFloat32(b uint8) float32 { return e4m3Table[b] }

// E5M2ToFloat32 converts OCP FP8 E5M2 bits to float32, exactly: E5M2 is
// the upper byte of an IEEE half (bias 15, subnormals, infinities, NaN).
func E5M2ToFloat32(b uint8) float32 { return e5m2Table[b] }

// e4m3Pos holds the finite non-negative E4M3 values in bit order (0x00 ..
// 0x7e), which is increasing order.
var e4m3Pos = e4m3Table[:0x7f]

// Float32ToE4M3 rounds v to the nearest E4M3 value, ties to the even bit
// pattern (as torch's float8_e4m3fn cast does). NaN becomes 0x7f. A
// magnitude of 464 or more (at or past halfway from 448, the largest
// value, to the next power-of-two step) is not representable: ok is false.
func Float32ToE4M3(v float32) (b uint8, ok bool) {
	if v != v {
		return 0x7f, true
	}
	var sign uint8
	if math.Signbit(float64(v)) {
		sign, v = 0x80, -v
	}
	i := sort.Search(len(e4m3Pos), func(i int) bool { return e4m3Pos[i] >= v })
	if i == len(e4m3Pos) {
		if v < 464 {
			return sign | 0x7e, true
		}
		return 0, false
	}
	if i > 0 && e4m3Pos[i] != v {
		lo, hi := v-e4m3Pos[i-1], e4m3Pos[i]-v
		if lo < hi || (lo == hi && (i-1)%2 == 0) {
			i--
		}
	}
	return sign | uint8(i), true
}

// isFP8 reports whether dtype is one of the fp8 dtypes the reader decodes.
func isFP8(dtype string) bool { return dtype == "F8_E4M3" || dtype == "F8_E5M2" }

// ScaleName is the name of the block-scale tensor of fp8 tensor name.
func ScaleName(name string) string { return name + "_scale_inv" }

// scaleShape is the shape of the scales of a rows × cols weight in
// br × bc blocks.
func scaleShape(rows, cols int, block [2]int) []int {
	return []int{(rows + block[0] - 1) / block[0], (cols + block[1] - 1) / block[1]}
}

// Dequantize returns fp8 tensor name (F8_E4M3 or F8_E5M2, shape want =
// rows × cols) as float32: every element times the float32 scale of its
// block in ScaleName(name), whose shape must be [ceil(rows/block[0]),
// ceil(cols/block[1])]. Errors name the tensor: missing, a shape other than
// want, a dtype that is not fp8, a want that is not 2-D, and a missing,
// mis-shaped or unreadable scale tensor. The slice is the caller's.
func (c *Checkpoint) Dequantize(name string, block [2]int, want ...int) ([]float32, error) {
	f := c.where[name]
	if f == nil {
		return nil, fmt.Errorf("checkpoint %s: tensor %q is missing (want shape %v)", c.dir, name, want)
	}
	ti := f.tensors[name]
	if !slices.Equal(ti.Shape, toInt64(want)) {
		return nil, fmt.Errorf("checkpoint %s: tensor %q has shape %v, want %v", c.dir, name, ti.Shape, want)
	}
	if !isFP8(ti.Dtype) {
		return nil, fmt.Errorf("checkpoint %s: tensor %q has dtype %s, not F8_E4M3 or F8_E5M2", c.dir, name, ti.Dtype)
	}
	if len(want) != 2 || block[0] < 1 || block[1] < 1 {
		return nil, fmt.Errorf("checkpoint %s: tensor %q: shape %v in blocks %v: block scales need a 2-D tensor and blocks >= 1", c.dir, name, want, block)
	}
	rows, cols := want[0], want[1]
	ss := scaleShape(rows, cols, block)
	sn := ScaleName(name)
	if !c.Has(sn) {
		return nil, fmt.Errorf("checkpoint %s: tensor %q is missing: the %s tensor %q needs its block scales (shape %v for %v blocks)", c.dir, sn, ti.Dtype, name, ss, block)
	}
	scale, err := c.Float32(sn, ss...)
	if err != nil {
		return nil, fmt.Errorf("%w (the block scales of %q, %v blocks)", err, name, block)
	}
	c.read[name] = true
	table := &e4m3Table
	if ti.Dtype == "F8_E5M2" {
		table = &e5m2Table
	}
	raw := f.data[f.base+ti.DataOffsets[0] : f.base+ti.DataOffsets[1]]
	out := make([]float32, rows*cols)
	for r := range rows {
		srow := scale[(r/block[0])*ss[1]:]
		for j, b := range raw[r*cols : (r+1)*cols] {
			out[r*cols+j] = table[b] * srow[j/block[1]]
		}
	}
	return out, nil
}

// QuantizeFP8 quantizes the rows × cols float32 weight data the way
// DeepSeek-V3's checkpoints are made: per block of block[0] × block[1]
// elements (ragged at the right and bottom edges), scale = max|w| / 448
// (1 for an all-zero block) and q = E4M3(w / scale), rounded to nearest
// even. It returns the weight (Dtype F8_E4M3, Data the E4M3 values q, so
// that WriteSafetensors stores them exactly) and its scales (Dtype F32,
// named ScaleName(name)); the dequantized weight is q × scale. Errors name
// the tensor: data that does not fill rows × cols, a block size below 1, a
// value that is not finite.
func QuantizeFP8(name string, rows, cols int, data []float32, block [2]int) (weight, scale Named, err error) {
	if rows < 1 || cols < 1 || len(data) != rows*cols {
		return weight, scale, fmt.Errorf("quantize %q: %d values for shape [%d %d]", name, len(data), rows, cols)
	}
	if block[0] < 1 || block[1] < 1 {
		return weight, scale, fmt.Errorf("quantize %q: weight_block_size %v: want two sizes >= 1", name, block)
	}
	ss := scaleShape(rows, cols, block)
	sc := make([]float32, ss[0]*ss[1])
	for r := range rows {
		for j := range cols {
			v := data[r*cols+j]
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return weight, scale, fmt.Errorf("quantize %q: element [%d %d] = %v: want a finite value", name, r, j, v)
			}
			k := (r/block[0])*ss[1] + j/block[1]
			sc[k] = max(sc[k], float32(math.Abs(float64(v))))
		}
	}
	for k, a := range sc {
		if a == 0 {
			sc[k] = 1
		} else {
			sc[k] = a / 448
		}
	}
	q := make([]float32, len(data))
	for r := range rows {
		for j := range cols {
			i := r*cols + j
			b, ok := Float32ToE4M3(data[i] / sc[(r/block[0])*ss[1]+j/block[1]])
			if !ok { // |w| / (amax/448) can round a hair above 448; it never reaches 464
				return weight, scale, fmt.Errorf("quantize %q: element [%d %d] = %v is out of the E4M3 range of its block", name, r, j, data[i])
			}
			q[i] = E4M3ToFloat32(b)
		}
	}
	return Named{Name: name, Shape: []int{rows, cols}, Dtype: "F8_E4M3", Data: q},
		Named{Name: ScaleName(name), Shape: ss, Dtype: "F32", Data: sc}, nil
}
