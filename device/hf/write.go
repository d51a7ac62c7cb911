package hf

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
)

// Named is one tensor to write: float32 data, row-major, stored at Dtype
// (F32, BF16 rounded to nearest even, or F8_E4M3 rounded to nearest
// even: QuantizeFP8 makes a weight and its block scales).
type Named struct {
	Name  string
	Shape []int
	Dtype string // "F32" (default), "BF16" or "F8_E4M3"
	Data  []float32
}

// WriteSafetensors writes tensors, in order, and the string metadata meta
// (nil: none) as a safetensors file at path. Errors name the tensor whose
// data does not fill its shape, its unknown dtype, or an F8_E4M3 value of
// magnitude 464 or more (beyond the format's 448).
func WriteSafetensors(path string, tensors []Named, meta map[string]string) error {
	header := map[string]any{}
	if meta != nil {
		header["__metadata__"] = meta
	}
	var body []byte
	for _, t := range tensors {
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		if n != len(t.Data) {
			return fmt.Errorf("safetensors: tensor %q: %d values for shape %v", t.Name, len(t.Data), t.Shape)
		}
		dt := t.Dtype
		if dt == "" {
			dt = "F32"
		}
		lo := len(body)
		switch dt {
		case "F32":
			for _, v := range t.Data {
				body = binary.LittleEndian.AppendUint32(body, math.Float32bits(v))
			}
		case "BF16":
			for _, v := range t.Data {
				body = binary.LittleEndian.AppendUint16(body, bf16(v))
			}
		case "F8_E4M3":
			for i, v := range t.Data {
				b, ok := Float32ToE4M3(v)
				if !ok {
					return fmt.Errorf("safetensors: tensor %q: element %d = %v is beyond the F8_E4M3 range (|v| < 464)", t.Name, i, v)
				}
				body = append(body, b)
			}
		default:
			return fmt.Errorf("safetensors: tensor %q: dtype %q: the writer stores F32, BF16 and F8_E4M3", t.Name, dt)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = map[string]any{"dtype": dt, "shape": shape, "data_offsets": []int{lo, len(body)}}
	}
	h, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(h)%8 != 0 { // the format pads the header with spaces to 8 bytes
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(out, h...), body...)
	return os.WriteFile(path, out, 0o644)
}

// bf16 rounds v to bfloat16 bits, to nearest even (NaN stays NaN).
func bf16(v float32) uint16 {
	b := math.Float32bits(v)
	if v != v {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
