package hf

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/model"
)

// e4m3Want is the E4M3 value of bits b derived from the format's
// definition alone (OCP FP8: sign, 4 exponent bits with bias 7, 3 mantissa
// bits, exponent 0 subnormal, S.1111.111 NaN, no infinities).
func e4m3Want(b uint8) float64 {
	sign, e, m := b>>7, int(b>>3)&0xf, int(b&7)
	var v float64
	switch {
	case e == 0xf && m == 7:
		return math.NaN()
	case e == 0:
		v = math.Ldexp(float64(m)/8, 1-7)
	default:
		v = math.Ldexp(1+float64(m)/8, e-7)
	}
	if sign == 1 {
		v = math.Copysign(v, -1)
	}
	return v
}

func TestE4M3AllPatterns(t *testing.T) {
	nans := 0
	for i := range 256 {
		b := uint8(i)
		got, want := E4M3ToFloat32(b), e4m3Want(b)
		if math.IsNaN(want) {
			nans++
			if got == got {
				t.Errorf("E4M3ToFloat32(%#02x) = %v, want NaN", b, got)
			}
			continue
		}
		if math.Float32bits(got) != math.Float32bits(float32(want)) || float64(float32(want)) != want {
			t.Errorf("E4M3ToFloat32(%#02x) = %v, want %v", b, got, want)
		}
		if back, ok := Float32ToE4M3(got); !ok || back != b {
			t.Errorf("Float32ToE4M3(%v) = %#02x, %v; want %#02x", got, back, ok, b)
		}
	}
	if nans != 2 {
		t.Errorf("%d NaN patterns, want 2 (0x7f, 0xff)", nans)
	}
	for _, c := range []struct {
		b    uint8
		want float64
	}{{0x7e, 448}, {0xfe, -448}, {0x01, math.Ldexp(1, -9)}, {0x08, math.Ldexp(1, -6)}, {0x07, 7 * math.Ldexp(1, -9)}, {0x38, 1}, {0x00, 0}} {
		if got := E4M3ToFloat32(c.b); float64(got) != c.want {
			t.Errorf("E4M3ToFloat32(%#02x) = %v, want %v", c.b, got, c.want)
		}
	}
	if got := E4M3ToFloat32(0x80); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("E4M3ToFloat32(0x80) = %v, want -0", got)
	}
}

func TestFloat32ToE4M3Rounds(t *testing.T) {
	for _, c := range []struct {
		v    float32
		want uint8
		ok   bool
	}{
		{1.0625, 0x38, true},                      // halfway between 1 (m 0) and 1.125 (m 1): even
		{1.1875, 0x3a, true},                      // halfway between 1.125 (m 1) and 1.25 (m 2): even
		{1.07, 0x39, true},                        // nearer 1.125
		{460, 0x7e, true},                         // below halfway to the next step: 448
		{-463.9, 0xfe, true},                      // likewise, negative
		{464, 0, false},                           // halfway: would round past 448
		{1e6, 0, false},                           // far out of range
		{float32(math.Ldexp(1, -10)), 0x00, true}, // halfway between 0 and 2^-9: even (0)
		{float32(3 * math.Ldexp(1, -11)), 0x01, true},
		{float32(math.Copysign(0, -1)), 0x80, true},
	} {
		if got, ok := Float32ToE4M3(c.v); got != c.want || ok != c.ok {
			t.Errorf("Float32ToE4M3(%v) = %#02x, %v; want %#02x, %v", c.v, got, ok, c.want, c.ok)
		}
	}
	if got, ok := Float32ToE4M3(float32(math.NaN())); got != 0x7f || !ok {
		t.Errorf("Float32ToE4M3(NaN) = %#02x, %v; want 0x7f", got, ok)
	}
}

func TestE5M2AllPatterns(t *testing.T) {
	for i := range 256 {
		b := uint8(i)
		sign, e, m := b>>7, int(b>>2)&0x1f, int(b&3)
		var want float64
		switch {
		case e == 0x1f && m == 0:
			want = math.Inf(1)
		case e == 0x1f:
			want = math.NaN()
		case e == 0:
			want = math.Ldexp(float64(m)/4, 1-15)
		default:
			want = math.Ldexp(1+float64(m)/4, e-15)
		}
		if sign == 1 {
			want = math.Copysign(want, -1)
		}
		got := E5M2ToFloat32(b)
		if math.IsNaN(want) {
			if got == got {
				t.Errorf("E5M2ToFloat32(%#02x) = %v, want NaN", b, got)
			}
		} else if math.Float32bits(got) != math.Float32bits(float32(want)) {
			t.Errorf("E5M2ToFloat32(%#02x) = %v, want %v", b, got, want)
		}
	}
	if got := E5M2ToFloat32(0x7b); got != 57344 {
		t.Errorf("E5M2ToFloat32(0x7b) = %v, want 57344", got)
	}
}

// A 5 × 7 weight in 2 × 3 blocks (ragged at both edges) round-trips
// through QuantizeFP8, WriteSafetensors and Dequantize.
func TestDequantize(t *testing.T) {
	const rows, cols = 5, 7
	block := [2]int{2, 3}
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(math.Sin(float64(i)*1.7)) * float32(1+i%4) // blocks of different ranges
	}
	w[0] = 0
	q, s, err := QuantizeFP8("x.weight", rows, cols, w, block)
	if err != nil {
		t.Fatal(err)
	}
	if q.Dtype != "F8_E4M3" || s.Name != "x.weight_scale_inv" || len(s.Shape) != 2 || s.Shape[0] != 3 || s.Shape[1] != 3 {
		t.Fatalf("QuantizeFP8: weight %s %v, scales %s %v; want F8_E4M3 and x.weight_scale_inv [3 3]", q.Dtype, q.Shape, s.Name, s.Shape)
	}
	// A 1-D E5M2 tensor by hand: 1.5 (0x3e), -2 (0xc0); and its scale.
	dir := t.TempDir()
	bad := Named{Name: "y.weight_scale_inv", Shape: []int{1, 2}, Data: []float32{1, 1}}
	if err := WriteSafetensors(filepath.Join(dir, "model.safetensors"), []Named{q, s, {Name: "f", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}},
		{Name: "y.weight", Shape: []int{2, 2}, Dtype: "F8_E4M3", Data: []float32{1, 2, 3, 4}}, bad,
		{Name: "z.weight", Shape: []int{1, 1}, Dtype: "F8_E4M3", Data: []float32{0.5}}}, nil); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	got, err := ck.Dequantize("x.weight", block, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	for r := range rows {
		for c := range cols {
			i := r*cols + c
			sc := s.Data[(r/2)*3+c/3]
			var amax float32
			for rr := r / 2 * 2; rr < min(r/2*2+2, rows); rr++ {
				for cc := c / 3 * 3; cc < min(c/3*3+3, cols); cc++ {
					amax = max(amax, float32(math.Abs(float64(w[rr*cols+cc]))))
				}
			}
			if want := q.Data[i] * sc; math.Float32bits(got[i]) != math.Float32bits(want) {
				t.Errorf("Dequantize[%d %d] = %v, want q %v × scale %v = %v", r, c, got[i], q.Data[i], sc, want)
			}
			// E4M3 keeps 3 mantissa bits: within 1/16 relative, or half the
			// smallest subnormal step of the block.
			if d := math.Abs(float64(got[i] - w[i])); d > math.Abs(float64(w[i]))/16+float64(sc)*math.Ldexp(1, -10) {
				t.Errorf("Dequantize[%d %d] = %v, far from the original %v (block max %v)", r, c, got[i], w[i], amax)
			}
			if want := amax / 448; amax > 0 && sc != want {
				t.Errorf("scale of [%d %d] = %v, want max|w| / 448 = %v", r, c, sc, want)
			}
		}
	}
	for _, c := range []struct {
		call func() error
		want string
	}{
		{func() error { _, err := ck.Float32("x.weight", rows, cols); return err }, `tensor "x.weight" has dtype F8_E4M3: an fp8 weight is read with its block scales "x.weight_scale_inv"`},
		{func() error { _, err := ck.Dequantize("f", block, 2, 2); return err }, `tensor "f" has dtype F32, not F8_E4M3`},
		{func() error { _, err := ck.Dequantize("x.weight", block, cols, rows); return err }, `tensor "x.weight" has shape [5 7], want [7 5]`},
		{func() error { _, err := ck.Dequantize("x.weight", [2]int{3, 3}, rows, cols); return err }, `tensor "x.weight_scale_inv" has shape [3 3], want [2 3]`},
		{func() error { _, err := ck.Dequantize("y.weight", block, 2, 2); return err }, `tensor "y.weight_scale_inv" has shape [1 2], want [1 1]`},
		{func() error { _, err := ck.Dequantize("z.weight", block, 1, 1); return err }, `tensor "z.weight_scale_inv" is missing: the F8_E4M3 tensor "z.weight" needs its block scales`},
		{func() error { _, err := ck.Dequantize("none", block, 1, 1); return err }, `tensor "none" is missing`},
		{func() error {
			return WriteSafetensors(filepath.Join(dir, "bad.safetensors"), []Named{{Name: "o", Shape: []int{1}, Dtype: "F8_E4M3", Data: []float32{500}}}, nil)
		}, `tensor "o": element 0 = 500 is beyond the F8_E4M3 range`},
	} {
		if err := c.call(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error = %v, want one containing %q", err, c.want)
		}
	}
	// E5M2 by hand: 1.5 (0x3e), -2 (0xc0), scale 0.5 → 0.75, -1.
	writeRaw(t, filepath.Join(dir, "model.safetensors"),
		`{"e.weight":{"dtype":"F8_E5M2","shape":[1,2],"data_offsets":[0,2]},"e.weight_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[2,6]}}`,
		[]byte{0x3e, 0xc0, 0x00, 0x00, 0x00, 0x3f})
	ck2, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck2.Close()
	if got, err := ck2.Dequantize("e.weight", [2]int{128, 128}, 1, 2); err != nil || got[0] != 0.75 || got[1] != -1 {
		t.Errorf("Dequantize(E5M2) = %v, %v; want [0.75 -1]", got, err)
	}
}

func TestParseQuant(t *testing.T) {
	base := `{"architectures":["DeepseekV3ForCausalLM"],"quantization_config":`
	c, err := model.ParseNumerics([]byte(base + `{"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,64]}}`))
	if err != nil || c.Quant == nil || c.Quant.BlockSize != [2]int{128, 64} || c.Quant.Fmt != "e4m3" {
		t.Errorf("model.ParseNumerics(fp8 [128 64]) = %+v, %v", c.Quant, err)
	}
	if c, err := model.ParseNumerics([]byte(base + `{"quant_method":"fp8"}}`)); err != nil || c.Quant.BlockSize != [2]int{128, 128} {
		t.Errorf("model.ParseNumerics(fp8, no block size) = %+v, %v; want [128 128]", c.Quant, err)
	}
	if c, err := model.ParseNumerics([]byte(`{"architectures":["DeepseekV3ForCausalLM"]}`)); err != nil || c.Quant != nil {
		t.Errorf("model.ParseNumerics(no quantization_config) = %+v, %v; want nil", c.Quant, err)
	}
	for _, c := range []struct{ q, want string }{
		{`{"quant_method":"gptq"}`, `quantization_config.quant_method "gptq"`},
		{`{"quant_method":"fp8","fmt":"int4"}`, `quantization_config.fmt "int4": allowed e4m3, e5m2`},
		{`{"quant_method":"fp8","weight_block_size":[128]}`, `quantization_config.weight_block_size [128]: want two integers >= 1`},
		{`{"quant_method":"fp8","weight_block_size":[0,128]}`, `weight_block_size [0,128]`},
	} {
		if _, err := model.ParseNumerics([]byte(base + c.q + "}")); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("model.ParseNumerics(%s) = %v, want an error containing %q", c.q, err, c.want)
		}
	}
}
