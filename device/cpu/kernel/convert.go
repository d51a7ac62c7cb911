package kernel

import (
	"encoding/binary"
	"math"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

// BF16FromFloat32 rounds f to bfloat16, to nearest with ties to even. Finite
// values whose magnitude rounds above the largest bf16 (about 3.39e38) become
// ±Inf, as IEEE rounding does; ±Inf stay ±Inf; NaN stays NaN (sign and the
// top payload bits kept, quiet bit set) so no NaN turns into Inf.
func BF16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// Float32FromBF16 widens a bfloat16 exactly.
func Float32FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// FP8Max is the largest finite float8 e4m3fn magnitude.
const FP8Max = 448

// FP8FromFloat32 converts f to OCP float8 e4m3fn (bias 7, no infinities,
// NaN = S.1111.111), rounding to nearest with ties to even, subnormals
// included (step 2^-9). It saturates: finite magnitudes above 448 and ±Inf
// become ±448 (0x7e / 0xfe), as DeepSeek's scaled quantization expects;
// NaN becomes 0x7f or 0xff (sign kept). -0 stays -0 (0x80).
func FP8FromFloat32(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	a := b & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return sign | 0x7f
	case a >= 0x43e00000: // >= 448 or Inf: saturate
		return sign | 0x7e
	case a < 0x3c800000: // below 2^-6: subnormal (or zero), code = round(|f| * 2^9)
		q := math.RoundToEven(float64(math.Float32frombits(a)) * 512)
		return sign | uint8(q) // q <= 8; 8 is the smallest normal's code
	}
	a += 0x7ffff + (a>>20)&1 // round the mantissa to 3 bits, carry into the exponent
	exp := a>>23 - 127 + 7
	return sign | uint8(exp<<3) | uint8(a>>20)&7
}

// fp8Table holds the float32 value of every fp8 e4m3fn code.
var fp8Table = func() (t [256]float32) {
	for c := 0; c < 256; c++ {
		exp, man := c>>3&0xf, c&7
		var v float64
		switch {
		case exp == 0xf && man == 7:
			v = math.NaN()
		case exp == 0:
			v = float64(man) / 512
		default:
			v = (1 + float64(man)/8) * math.Ldexp(1, exp-7)
		}
		if c&0x80 != 0 {
			v = -v
		}
		t[c] = float32(v)
	}
	return t
}()

// Float32FromFP8 widens a float8 e4m3fn code exactly (0x7f and 0xff are NaN).
func Float32FromFP8(c uint8) float32 { return fp8Table[c] }

// Round rounds every element of x in place to what a cache of dtype d stores
// and reads back: a dense reference applies it to K/V (or latents) so that it
// sees exactly what the paged kernel reads.
func Round(d kernelspec.Dtype, x []float32) {
	switch d {
	case kernelspec.BF16:
		for i, v := range x {
			x[i] = Float32FromBF16(BF16FromFloat32(v))
		}
	case kernelspec.FP8:
		for i, v := range x {
			x[i] = fp8Table[FP8FromFloat32(v)]
		}
	}
}

// encodeRow stores src at dtype d into dst (len(dst) >= len(src)*d.Size()).
func encodeRow(d kernelspec.Dtype, dst []byte, src []float32) {
	switch d {
	case kernelspec.BF16:
		dst = dst[:2*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], BF16FromFloat32(v))
		}
	case kernelspec.FP8:
		dst = dst[:len(src)]
		for i, v := range src {
			dst[i] = FP8FromFloat32(v)
		}
	case kernelspec.F32:
		dst = dst[:4*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	}
}

// decodeRow reads len(dst) elements of dtype d from src.
func decodeRow(d kernelspec.Dtype, dst []float32, src []byte) {
	switch d {
	case kernelspec.BF16:
		n := len(dst)
		src = src[:2*n]
		i := 0
		for ; i+4 <= n; i += 4 { // four elements per 8-byte load
			v := binary.LittleEndian.Uint64(src[2*i : 2*i+8])
			d := dst[i : i+4 : i+4]
			lo, hi := uint32(v), uint32(v>>32)
			d[0] = math.Float32frombits(lo << 16)
			d[1] = math.Float32frombits(lo & 0xffff0000)
			d[2] = math.Float32frombits(hi << 16)
			d[3] = math.Float32frombits(hi & 0xffff0000)
		}
		for ; i < n; i++ {
			dst[i] = Float32FromBF16(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case kernelspec.FP8:
		src = src[:len(dst)]
		for i, c := range src {
			dst[i] = fp8Table[c]
		}
	case kernelspec.F32:
		src = src[:4*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	}
}

// dotFP8 is Dot(q, row decoded as fp8) with Dot's summation order, without
// a decode buffer (the indexer's inner loop).
func dotFP8(q []float32, row []byte) float32 {
	var s0, s1, s2, s3 float32
	n := len(q)
	row = row[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		r := row[i : i+4 : i+4]
		s0 += float32(q[i] * fp8Table[r[0]])
		s1 += float32(q[i+1] * fp8Table[r[1]])
		s2 += float32(q[i+2] * fp8Table[r[2]])
		s3 += float32(q[i+3] * fp8Table[r[3]])
	}
	for ; i < n; i++ {
		p := float32(q[i] * fp8Table[row[i]])
		switch i & 3 {
		case 0:
			s0 += p
		case 1:
			s1 += p
		case 2:
			s2 += p
		default:
			s3 += p
		}
	}
	return (s0 + s1) + (s2 + s3)
}

// dot2BF16 returns Dot(qa, k) and Dot(qb, k) for k the bf16 row, in Dot's
// order, reading each element once (two heads sharing a kv row).
func dot2BF16(qa, qb []float32, row []byte) (float32, float32) {
	n := len(qa)
	qb = qb[:n]
	row = row[:2*n]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		v := binary.LittleEndian.Uint64(row[2*i : 2*i+8])
		lo, hi := uint32(v), uint32(v>>32)
		k0, k1 := math.Float32frombits(lo<<16), math.Float32frombits(lo&0xffff0000)
		k2, k3 := math.Float32frombits(hi<<16), math.Float32frombits(hi&0xffff0000)
		x, y := qa[i:i+4:i+4], qb[i:i+4:i+4]
		a0 += float32(x[0] * k0)
		b0 += float32(y[0] * k0)
		a1 += float32(x[1] * k1)
		b1 += float32(y[1] * k1)
		a2 += float32(x[2] * k2)
		b2 += float32(y[2] * k2)
		a3 += float32(x[3] * k3)
		b3 += float32(y[3] * k3)
	}
	for ; i < n; i++ {
		k := Float32FromBF16(binary.LittleEndian.Uint16(row[2*i:]))
		pa, pb := float32(qa[i]*k), float32(qb[i]*k)
		switch i & 3 {
		case 0:
			a0, b0 = a0+pa, b0+pb
		case 1:
			a1, b1 = a1+pa, b1+pb
		case 2:
			a2, b2 = a2+pa, b2+pb
		default:
			a3, b3 = a3+pa, b3+pb
		}
	}
	return (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3)
}

// axpy2BF16 is Axpy(ya, ea, v) and Axpy(yb, eb, v) for v the bf16 row,
// reading each element once.
func axpy2BF16(ya, yb []float32, ea, eb float32, row []byte) {
	n := len(ya)
	yb = yb[:n]
	row = row[:2*n]
	i := 0
	for ; i+4 <= n; i += 4 {
		v := binary.LittleEndian.Uint64(row[2*i : 2*i+8])
		lo, hi := uint32(v), uint32(v>>32)
		k0, k1 := math.Float32frombits(lo<<16), math.Float32frombits(lo&0xffff0000)
		k2, k3 := math.Float32frombits(hi<<16), math.Float32frombits(hi&0xffff0000)
		x, y := ya[i:i+4:i+4], yb[i:i+4:i+4]
		x[0] += float32(ea * k0)
		y[0] += float32(eb * k0)
		x[1] += float32(ea * k1)
		y[1] += float32(eb * k1)
		x[2] += float32(ea * k2)
		y[2] += float32(eb * k2)
		x[3] += float32(ea * k3)
		y[3] += float32(eb * k3)
	}
	for ; i < n; i++ {
		k := Float32FromBF16(binary.LittleEndian.Uint16(row[2*i:]))
		ya[i] += float32(ea * k)
		yb[i] += float32(eb * k)
	}
}
