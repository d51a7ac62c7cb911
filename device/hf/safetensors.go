package hf

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
)

// MaxHeaderBytes is the largest safetensors JSON header the reader accepts
// (the format's own limit is 100 MB).
const MaxHeaderBytes = 100 << 20

// TensorInfo is one tensor's entry in a safetensors header.
type TensorInfo struct {
	Dtype       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// elemBytes returns the bytes of one element of the dtypes the reader
// converts (F32, BF16, F16; F8_E4M3 and F8_E5M2 with their block scales:
// fp8.go), or 0.
func elemBytes(dtype string) int {
	switch dtype {
	case "F32":
		return 4
	case "BF16", "F16":
		return 2
	case "F8_E4M3", "F8_E5M2":
		return 1
	}
	return 0
}

// file is one memory-mapped safetensors file.
type file struct {
	path    string
	data    []byte // the whole file, mapped read-only
	base    int64  // start of the data section
	tensors map[string]TensorInfo
	meta    map[string]string
}

// openFile maps path and parses its header. Errors name the file and what
// is wrong with it: not a regular file, a short file, a header length above
// MaxHeaderBytes or past the end, bad JSON, or a tensor whose offsets leave
// the data section, overlap another's, or do not match its dtype and shape,
// or whose shape has more elements than the file has bits.
func openFile(path string) (*file, error) {
	// A directory or a named pipe is refused before it is opened (opening
	// a pipe would wait for a writer).
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("safetensors %s: mode %v: want a regular file", path, st.Mode())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("safetensors %s: %d bytes, shorter than the 8-byte header length", path, size)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: mmap: %w", path, err)
	}
	sf, err := parseFile(path, data)
	if err != nil {
		_ = syscall.Munmap(data)
		return nil, err
	}
	return sf, nil
}

// parseFile parses the safetensors bytes data (header and data section).
func parseFile(path string, data []byte) (*file, error) {
	size := int64(len(data))
	n := binary.LittleEndian.Uint64(data[:8])
	if n > MaxHeaderBytes || int64(n) > size-8 {
		return nil, fmt.Errorf("safetensors %s: header length %d exceeds the file (%d bytes) or the limit %d", path, n, size, MaxHeaderBytes)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &raw); err != nil {
		return nil, fmt.Errorf("safetensors %s: header: %w", path, err)
	}
	sf := &file{path: path, data: data, base: 8 + int64(n), tensors: map[string]TensorInfo{}}
	type span struct {
		name   string
		lo, hi int64
	}
	var spans []span
	for name, v := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(v, &sf.meta); err != nil {
				return nil, fmt.Errorf("safetensors %s: __metadata__: %w (want an object of strings)", path, err)
			}
			continue
		}
		var ti TensorInfo
		if err := json.Unmarshal(v, &ti); err != nil {
			return nil, fmt.Errorf("safetensors %s: tensor %q: %w", path, name, err)
		}
		// No dtype has less than a bit an element, so a shape of more
		// elements than the file has bits is refused, before its product
		// can overflow.
		elems, maxElems := int64(1), 8*size
		for _, d := range ti.Shape {
			if d < 0 {
				return nil, fmt.Errorf("safetensors %s: tensor %q: shape %v has a negative dimension", path, name, ti.Shape)
			}
			if d > 0 && elems > maxElems/d {
				return nil, fmt.Errorf("safetensors %s: tensor %q: shape %v has more elements than the file's %d bytes can hold (at most %d)", path, name, ti.Shape, size, maxElems)
			}
			elems *= d
		}
		lo, hi := ti.DataOffsets[0], ti.DataOffsets[1]
		if lo < 0 || hi < lo || hi > size-sf.base {
			return nil, fmt.Errorf("safetensors %s: tensor %q: data offsets [%d, %d] outside the %d data bytes", path, name, lo, hi, size-sf.base)
		}
		if eb := elemBytes(ti.Dtype); eb > 0 && hi-lo != elems*int64(eb) {
			return nil, fmt.Errorf("safetensors %s: tensor %q: %d data bytes, want %d (%s, shape %v)", path, name, hi-lo, elems*int64(eb), ti.Dtype, ti.Shape)
		}
		sf.tensors[name] = ti
		spans = append(spans, span{name, lo, hi})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return nil, fmt.Errorf("safetensors %s: tensors %q and %q overlap (bytes %d and %d)", path, spans[i-1].name, spans[i].name, spans[i-1].hi, spans[i].lo)
		}
	}
	return sf, nil
}

// Checkpoint is the weights of a Hugging Face checkpoint directory:
// model.safetensors, or the shards model.safetensors.index.json names,
// memory-mapped. Tensors are converted to float32 on reading. A Checkpoint
// is not safe for concurrent use; Close unmaps the files.
type Checkpoint struct {
	dir   string
	files []*file
	where map[string]*file // tensor name -> its file
	read  map[string]bool  // names Float32 was asked for
}

// OpenCheckpoint maps the weights of checkpoint directory dir. Errors name
// the file: none of model.safetensors and model.safetensors.index.json, a
// bad index, a shard that fails to parse, a tensor in two shards or in a
// shard other than the index says.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	c := &Checkpoint{dir: dir, where: map[string]*file{}, read: map[string]bool{}}
	single := filepath.Join(dir, "model.safetensors")
	index := filepath.Join(dir, "model.safetensors.index.json")
	var shards []string
	var weightMap map[string]string
	if _, err := os.Stat(single); err == nil {
		shards = []string{"model.safetensors"}
	} else if data, err := os.ReadFile(index); err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(data, &idx); err != nil {
			return nil, fmt.Errorf("checkpoint %s: model.safetensors.index.json: %w", dir, err)
		}
		if len(idx.WeightMap) == 0 {
			return nil, fmt.Errorf("checkpoint %s: model.safetensors.index.json has no weight_map entries", dir)
		}
		weightMap = idx.WeightMap
		seen := map[string]bool{}
		for _, s := range idx.WeightMap {
			if !seen[s] {
				seen[s] = true
				shards = append(shards, s)
			}
		}
		slices.Sort(shards)
	} else {
		return nil, fmt.Errorf("checkpoint %s: neither model.safetensors nor model.safetensors.index.json is there", dir)
	}
	for _, s := range shards {
		if filepath.Base(s) != s {
			c.Close()
			return nil, fmt.Errorf("checkpoint %s: shard %q is not a file name in the directory", dir, s)
		}
		f, err := openFile(filepath.Join(dir, s))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
		}
		c.files = append(c.files, f)
		for name := range f.tensors {
			if prev, ok := c.where[name]; ok {
				c.Close()
				return nil, fmt.Errorf("checkpoint %s: tensor %q is in both %s and %s", dir, name, filepath.Base(prev.path), s)
			}
			if weightMap != nil && weightMap[name] != s {
				c.Close()
				return nil, fmt.Errorf("checkpoint %s: tensor %q is in shard %s, the index says %q", dir, name, s, weightMap[name])
			}
			c.where[name] = f
		}
	}
	for name, s := range weightMap {
		if c.where[name] == nil {
			c.Close()
			return nil, fmt.Errorf("checkpoint %s: the index puts tensor %q in %s, which does not hold it", dir, name, s)
		}
	}
	return c, nil
}

// Close unmaps the files. Slices Float32 returned stay valid (they are
// copies).
func (c *Checkpoint) Close() {
	for _, f := range c.files {
		_ = syscall.Munmap(f.data)
	}
	c.files = nil
}

// Names returns every tensor name, sorted.
func (c *Checkpoint) Names() []string {
	var out []string
	for n := range c.where {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Info returns the header entry of tensor name.
func (c *Checkpoint) Info(name string) (TensorInfo, bool) {
	f := c.where[name]
	if f == nil {
		return TensorInfo{}, false
	}
	return f.tensors[name], true
}

// Has reports whether the checkpoint holds tensor name.
func (c *Checkpoint) Has(name string) bool { return c.where[name] != nil }

// Float32 returns tensor name converted to float32, row-major, after
// checking that its shape is want. Errors name the tensor: missing, a shape
// other than want, or a dtype other than F32, BF16 and F16 (an fp8 tensor
// is read with Dequantize). The slice is the caller's.
func (c *Checkpoint) Float32(name string, want ...int) ([]float32, error) {
	f := c.where[name]
	if f == nil {
		return nil, fmt.Errorf("checkpoint %s: tensor %q is missing (want shape %v)", c.dir, name, want)
	}
	ti := f.tensors[name]
	if !slices.Equal(ti.Shape, toInt64(want)) {
		return nil, fmt.Errorf("checkpoint %s: tensor %q has shape %v, want %v", c.dir, name, ti.Shape, want)
	}
	c.read[name] = true
	raw := f.data[f.base+ti.DataOffsets[0] : f.base+ti.DataOffsets[1]]
	switch ti.Dtype {
	case "F32":
		out := make([]float32, len(raw)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		return out, nil
	case "BF16":
		out := make([]float32, len(raw)/2)
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(raw[2*i:])) << 16)
		}
		return out, nil
	case "F16":
		out := make([]float32, len(raw)/2)
		for i := range out {
			out[i] = F16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
		return out, nil
	}
	if isFP8(ti.Dtype) {
		return nil, fmt.Errorf("checkpoint %s: tensor %q has dtype %s: an fp8 weight is read with its block scales %q (Dequantize)", c.dir, name, ti.Dtype, ScaleName(name))
	}
	return nil, fmt.Errorf("checkpoint %s: tensor %q has dtype %s; the reader converts F32, BF16 and F16 (and F8_E4M3, F8_E5M2 with block scales)", c.dir, name, ti.Dtype)
}

// BF16 returns tensor name's bytes when it is stored as BF16 with shape
// want: the little-endian bf16 values, row-major, aliasing the mapped file
// (valid until Close; the caller must not modify or keep them). ok is false,
// with no error, for any other dtype (read it with Float32); the errors are
// Float32's for a missing tensor or a shape other than want.
func (c *Checkpoint) BF16(name string, want ...int) (raw []byte, ok bool, err error) {
	f := c.where[name]
	if f == nil {
		return nil, false, fmt.Errorf("checkpoint %s: tensor %q is missing (want shape %v)", c.dir, name, want)
	}
	ti := f.tensors[name]
	if !slices.Equal(ti.Shape, toInt64(want)) {
		return nil, false, fmt.Errorf("checkpoint %s: tensor %q has shape %v, want %v", c.dir, name, ti.Shape, want)
	}
	if ti.Dtype != "BF16" {
		return nil, false, nil
	}
	c.read[name] = true
	return f.data[f.base+ti.DataOffsets[0] : f.base+ti.DataOffsets[1]], true, nil
}

func toInt64(v []int) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// F16ToFloat32 converts IEEE 754 half precision bits to float32 (exact:
// subnormals, infinities and NaN included).
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: mant · 2^-24
		v := float32(mant) * float32(1.0/(1<<24))
		if sign != 0 {
			v = -v
		}
		return v
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}
