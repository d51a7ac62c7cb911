package hf

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// maxFuzzFile bounds the bytes one fuzz input may write, so that the seed
// corpus runs in well under a second as a unit test.
const maxFuzzFile = 1 << 20

// seedCheckpoint adds the model.safetensors of a bundled checkpoint, cut
// to its header and the first bytes of its data (the whole files are
// hundreds of KB), as a seed.
func seedCheckpoint(f *testing.F, dir string) {
	data, err := os.ReadFile(filepath.Join("testdata", dir, "model.safetensors"))
	if err != nil {
		f.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(data)
	f.Add(data[:min(uint64(len(data)), 8+n+4096)])
}

// safetensorsBytes is a safetensors file of header and data.
func safetensorsBytes(header string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(out, header...), data...)
}

// readAll reads every tensor of c by its own shape as the loaders do
// (Float32, BF16, Dequantize with 1×1 and 2×3 blocks) and fails t when a
// read returns a slice of the wrong length.
func readAll(t *testing.T, c *Checkpoint) {
	for _, name := range c.Names() {
		ti, ok := c.Info(name)
		if !ok {
			t.Fatalf("Info(%q) = false for a name Names returned", name)
		}
		shape := make([]int, len(ti.Shape))
		elems := 1
		for i, d := range ti.Shape {
			shape[i] = int(d)
			elems *= int(d)
		}
		if v, err := c.Float32(name, shape...); err == nil && len(v) != elems {
			t.Fatalf("Float32(%q, %v) = %d values, want %d", name, shape, len(v), elems)
		}
		if raw, ok, err := c.BF16(name, shape...); err == nil && ok && len(raw) != 2*elems {
			t.Fatalf("BF16(%q, %v) = %d bytes, want %d", name, shape, len(raw), 2*elems)
		}
		for _, block := range [][2]int{{1, 1}, {2, 3}} {
			if v, err := c.Dequantize(name, block, shape...); err == nil && len(v) != elems {
				t.Fatalf("Dequantize(%q, %v, %v) = %d values, want %d", name, block, shape, len(v), elems)
			}
		}
	}
}

// maxAllocPerByte bounds what opening a checkpoint and reading every
// tensor may allocate on the heap per byte of its files (beyond a fixed
// 1 MiB): a float32 copy is at most 4 bytes per stored byte (fp8).
const maxAllocPerByte = 16

// openAndRead opens dir and reads every tensor of it (readAll), and fails
// t when that allocated more than maxAllocPerByte per byte of its n bytes
// of files.
func openAndRead(t *testing.T, dir string, n int) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if c, err := OpenCheckpoint(dir); err == nil {
		readAll(t, c)
		c.Close()
	}
	runtime.ReadMemStats(&after)
	if a := after.TotalAlloc - before.TotalAlloc; a > maxAllocPerByte*uint64(n)+1<<20 {
		t.Fatalf("opening and reading %d bytes allocated %d bytes, more than %d per byte", n, a, maxAllocPerByte)
	}
}

// FuzzOpenCheckpoint writes the input as model.safetensors and opens it with
// OpenCheckpoint, then reads every tensor it lists. Properties: no panic;
// memory bounded by the input (no allocation sized by a length or shape
// field the bytes do not back); a refused file is an error, never a
// Checkpoint whose reads go out of bounds.
func FuzzOpenCheckpoint(f *testing.F) {
	for _, d := range []string{"llama", "qwen3", "deepseek_v3", "nemotron_h"} {
		seedCheckpoint(f, d)
	}
	f.Add(safetensorsBytes(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(safetensorsBytes(`{"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, []byte{0x00, 0x3c, 0x00, 0xc0}))
	f.Add(safetensorsBytes(`{"w":{"dtype":"F8_E4M3","shape":[2,3],"data_offsets":[0,6]},"w_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[6,10]}}`, make([]byte, 10)))
	f.Add(safetensorsBytes(`{"e":{"dtype":"BF16","shape":[0,4],"data_offsets":[0,0]}}`, nil))
	f.Add(safetensorsBytes(`{"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<40))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzFile {
			t.Skip()
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		openAndRead(t, dir, len(data))
	})
}

// FuzzOpenShardedCheckpoint writes the input as model.safetensors.index.json
// and one shard, model-00001-of-00001.safetensors, and opens the directory
// with OpenCheckpoint. Properties: as FuzzOpenCheckpoint's; a bad index (bad
// JSON, no weight_map, a shard that is not a plain file of the directory, a
// tensor the index misplaces) is an error, in time linear in the index.
func FuzzOpenShardedCheckpoint(f *testing.F) {
	shard := safetensorsBytes(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]}}`, make([]byte, 10))
	const name = "model-00001-of-00001.safetensors"
	f.Add([]byte(`{"metadata":{"total_size":10},"weight_map":{"x":"`+name+`","y":"`+name+`"}}`), shard)
	f.Add([]byte(`{"weight_map":{"x":"`+name+`"}}`), shard)
	f.Add([]byte(`{"weight_map":{"x":"model-00002-of-00002.safetensors","y":"`+name+`"}}`), shard)
	f.Add([]byte(`{"weight_map":{"x":"../`+name+`","y":"`+name+`"}}`), shard)
	f.Add([]byte(`{"weight_map":{"x":".","y":".."}}`), shard)
	f.Add([]byte(`{"weight_map":{}}`), shard)
	f.Add([]byte(`{"weight_map":null}`), shard)
	f.Add([]byte(`[]`), shard)
	f.Fuzz(func(t *testing.T, index, shard []byte) {
		if len(index)+len(shard) > maxFuzzFile {
			t.Skip()
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), index, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), shard, 0o644); err != nil {
			t.Fatal(err)
		}
		openAndRead(t, dir, len(index)+len(shard))
	})
}
