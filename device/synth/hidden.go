package synth

import (
	"encoding/binary"
	"fmt"
	"math"
)

// EncodeHidden appends h (rows × hidden float32, row-major) to dst as exact
// float32 bits, little endian, 4 bytes per element, and returns the result.
// This is the format of worker.Batch.Hidden between stages.
func EncodeHidden(dst []byte, h []float32) []byte {
	for _, v := range h {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// DecodeHidden reads rows × hidden float32 values written by EncodeHidden.
// It fails, naming both lengths, when len(b) != rows*hidden*4.
func DecodeHidden(b []byte, rows, hidden int) ([]float32, error) {
	if want := rows * hidden * 4; len(b) != want {
		return nil, fmt.Errorf("synth: hidden activations are %d bytes, want %d (%d rows × hidden %d × 4)", len(b), want, rows, hidden)
	}
	out := make([]float32, rows*hidden)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}
