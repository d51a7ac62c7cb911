package hf

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSafetensorsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	a := []float32{1, -2.5, 3.25, 0, float32(math.Inf(1)), -0.0078125}
	b := []float32{1.00390625, 3.14159, -1e-3, 65504} // rounded to bf16 on writing
	err := WriteSafetensors(filepath.Join(dir, "model.safetensors"), []Named{
		{Name: "a", Shape: []int{2, 3}, Data: a},
		{Name: "b", Shape: []int{4}, Dtype: "BF16", Data: b},
	}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Names() = %v, want [a b]", got)
	}
	got, err := c.Float32("a", 2, 3)
	if err != nil || !slices.Equal(got, a) {
		t.Errorf("Float32(a) = %v, %v; want %v", got, err, a)
	}
	gb, err := c.Float32("b", 4)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range b {
		want := math.Float32frombits(uint32(bf16(v)) << 16)
		if gb[i] != want || math.Abs(float64(gb[i]-v)) > math.Abs(float64(v))/128 {
			t.Errorf("Float32(b)[%d] = %v, want bf16(%v) = %v", i, gb[i], v, want)
		}
	}
	if gb[0] != 1 { // 1.00390625 is halfway between 1 and 1.0078125: ties to even
		t.Errorf("bf16(1.00390625) = %v, want 1 (nearest even)", gb[0])
	}
	if c.files[0].meta["format"] != "pt" {
		t.Errorf("__metadata__ = %v, want format pt", c.files[0].meta)
	}
	for _, tc := range []struct {
		name  string
		shape []int
		want  string
	}{{"a", []int{3, 2}, `tensor "a" has shape [2 3], want [3 2]`}, {"zz", []int{1}, `tensor "zz" is missing`}} {
		if _, err := c.Float32(tc.name, tc.shape...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Float32(%s, %v) = %v, want an error containing %q", tc.name, tc.shape, err, tc.want)
		}
	}
}

func TestF16(t *testing.T) {
	for _, c := range []struct {
		bits uint16
		want float32
	}{{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, float32(math.Ldexp(1, -24))}, {0x0400, float32(math.Ldexp(1, -14))},
		{0x8000, float32(math.Copysign(0, -1))}, {0x7c00, float32(math.Inf(1))}, {0x3555, 0.33325195}} {
		if got := F16ToFloat32(c.bits); math.Float32bits(got) != math.Float32bits(c.want) {
			t.Errorf("F16ToFloat32(%#04x) = %v, want %v", c.bits, got, c.want)
		}
	}
	if v := F16ToFloat32(0x7e00); v == v {
		t.Errorf("F16ToFloat32(0x7e00) = %v, want NaN", v)
	}
	// An F16 tensor in a file, written by hand.
	dir := t.TempDir()
	writeRaw(t, filepath.Join(dir, "model.safetensors"), `{"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, []byte{0x00, 0x3c, 0x00, 0xc0})
	c, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := c.Float32("h", 2); err != nil || !slices.Equal(got, []float32{1, -2}) {
		t.Errorf("Float32(h) = %v, %v; want [1 -2]", got, err)
	}
}

// writeRaw writes a safetensors file from a header and a data section.
func writeRaw(t *testing.T, path, header string, data []byte) []byte {
	t.Helper()
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(append(out, header...), data...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSafetensorsRejects(t *testing.T) {
	for _, c := range []struct {
		name, header string
		data         []byte
		want         string
	}{
		{"past the end", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 4), "outside the 4 data bytes"},
		{"wrong size", `{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 8), "8 data bytes, want 12"},
		{"overlap", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8), "overlap"},
		{"bad json", `{"a":`, nil, "header"},
		{"negative dim", `{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}`, nil, "negative dimension"},
		// Found writing FuzzOpenCheckpoint (testdata/fuzz): base + hi
		// overflowed past the end check, and Float32 sliced at a negative index.
		{"offsets overflow", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[9223372036854775803,9223372036854775807]}}`, nil, "outside the 0 data bytes"},
		// The shape's product wrapped to 0, so 0 data bytes matched it, and
		// Dequantize sliced past the end of them.
		{"shape overflow", `{"w":{"dtype":"F8_E4M3","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`, nil, "more elements than the file's"},
	} {
		dir := t.TempDir()
		writeRaw(t, filepath.Join(dir, "model.safetensors"), c.header, c.data)
		if _, err := OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: OpenCheckpoint = %v, want an error containing %q", c.name, err, c.want)
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), binary.LittleEndian.AppendUint64(nil, 1<<40), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), "header length") {
		t.Errorf("huge header length: OpenCheckpoint = %v, want a header length error", err)
	}
	if _, err := OpenCheckpoint(t.TempDir()); err == nil || !strings.Contains(err.Error(), "neither model.safetensors") {
		t.Errorf("empty dir: OpenCheckpoint = %v, want neither-file error", err)
	}
	// An unsupported dtype reads as an error naming the tensor.
	dir = t.TempDir()
	writeRaw(t, filepath.Join(dir, "model.safetensors"), `{"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, make([]byte, 8))
	c, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Float32("i", 1); err == nil || !strings.Contains(err.Error(), `tensor "i" has dtype I64`) {
		t.Errorf("Float32(i) = %v, want a dtype error", err)
	}
}

func TestShardedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	write := func(file string, ts ...Named) {
		if err := WriteSafetensors(filepath.Join(dir, file), ts, nil); err != nil {
			t.Fatal(err)
		}
	}
	write("model-00001-of-00002.safetensors", Named{Name: "x", Shape: []int{2}, Data: []float32{1, 2}})
	write("model-00002-of-00002.safetensors", Named{Name: "y", Shape: []int{1}, Data: []float32{3}})
	index := func(m map[string]string) {
		data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 12}, "weight_map": m})
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	index(map[string]string{"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"})
	c, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	x, err1 := c.Float32("x", 2)
	y, err2 := c.Float32("y", 1)
	c.Close()
	if err1 != nil || err2 != nil || !slices.Equal(x, []float32{1, 2}) || !slices.Equal(y, []float32{3}) {
		t.Errorf("x, y = %v %v (%v, %v); want [1 2] [3]", x, y, err1, err2)
	}
	index(map[string]string{"x": "model-00002-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"})
	if _, err := OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), `tensor "y"`) && !strings.Contains(err.Error(), `tensor "x"`) {
		t.Errorf("index naming the wrong shard: OpenCheckpoint = %v, want an error naming the tensor", err)
	}
	write("model-00002-of-00002.safetensors", Named{Name: "x", Shape: []int{2}, Data: []float32{1, 2}}, Named{Name: "y", Shape: []int{1}, Data: []float32{3}})
	index(map[string]string{"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"})
	if _, err := OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), `tensor "x" is in both`) {
		t.Errorf("tensor in two shards: OpenCheckpoint = %v, want an error naming it", err)
	}
}
