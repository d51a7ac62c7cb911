package kernel

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

func TestBF16AllValuesRoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := Float32FromBF16(uint16(h))
		got := BF16FromFloat32(f)
		if f != f { // NaN: stays a NaN with the same sign
			if g := Float32FromBF16(got); g == g || got&0x8000 != uint16(h)&0x8000 {
				t.Fatalf("BF16FromFloat32(NaN %#04x) = %#04x, want a NaN of the same sign", h, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Fatalf("BF16FromFloat32(Float32FromBF16(%#04x)) = %#04x", h, got)
		}
	}
}

// bf16Nearest is the brute-force oracle: the nearer of the two bf16
// neighbours of f, ties to the even code.
func bf16Nearest(f float32) uint16 {
	b := math.Float32bits(f)
	lo := uint16(b >> 16) // truncation: same sign, magnitude <= |f|
	hi := lo + 1
	dlo := math.Abs(float64(f) - float64(Float32FromBF16(lo)))
	fhi := float64(Float32FromBF16(hi))
	if hi&0x7fff == 0x7f80 { // next is Inf: compare with the rounding boundary 2^128
		fhi = math.Copysign(math.Ldexp(1, 128), float64(f))
	}
	dhi := math.Abs(fhi - float64(f))
	switch {
	case dlo < dhi:
		return lo
	case dhi < dlo:
		return hi
	case lo&1 == 0:
		return lo
	}
	return hi
}

func TestBF16RoundsToNearestEven(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(f float32) {
		if f != f || math.IsInf(float64(f), 0) {
			return
		}
		if got, want := BF16FromFloat32(f), bf16Nearest(f); got != want {
			t.Fatalf("BF16FromFloat32(%g [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	for i := 0; i < 200000; i++ {
		check(math.Float32frombits(r.Uint32()))
	}
	// Exact ties and their neighbours, including the overflow edge.
	for h := 0; h < 1<<16; h += 7 {
		b := uint32(h)<<16 | 0x8000
		check(math.Float32frombits(b))
		check(math.Float32frombits(b - 1))
		check(math.Float32frombits(b + 1))
	}
	for _, tc := range []struct {
		in   float32
		want uint16
	}{
		{float32(math.Inf(1)), 0x7f80},
		{float32(math.Inf(-1)), 0xff80},
		{math.MaxFloat32, 0x7f80}, // rounds past the largest bf16
		{-math.MaxFloat32, 0xff80},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3f80},
	} {
		if got := BF16FromFloat32(tc.in); got != tc.want {
			t.Errorf("BF16FromFloat32(%g) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
	if got := BF16FromFloat32(math.Float32frombits(0x7f800001)); got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("BF16FromFloat32(signalling NaN) = %#04x, want a NaN", got)
	}
}

func TestFP8AllValuesRoundTrip(t *testing.T) {
	for c := 0; c < 256; c++ {
		f := Float32FromFP8(uint8(c))
		got := FP8FromFloat32(f)
		if c&0x7f == 0x7f {
			if f == f || got != uint8(c) {
				t.Fatalf("fp8 %#02x: value %g, back %#02x; want NaN and the same code", c, f, got)
			}
			continue
		}
		if got != uint8(c) {
			t.Fatalf("FP8FromFloat32(Float32FromFP8(%#02x) = %g) = %#02x", c, f, got)
		}
	}
	if Float32FromFP8(0x7e) != 448 || Float32FromFP8(0x01) != 1.0/512 || Float32FromFP8(0x08) != 1.0/64 {
		t.Errorf("fp8 table: max %g, min subnormal %g, min normal %g", Float32FromFP8(0x7e), Float32FromFP8(0x01), Float32FromFP8(0x08))
	}
}

// fp8Nearest is the brute-force oracle over the 126 finite magnitudes.
func fp8Nearest(f float32) uint8 {
	a := math.Abs(float64(f))
	var sign uint8
	if math.Signbit(float64(f)) {
		sign = 0x80
	}
	if a > FP8Max {
		return sign | 0x7e
	}
	best := uint8(0)
	for c := uint8(1); c <= 0x7e; c++ {
		d, db := math.Abs(float64(Float32FromFP8(c))-a), math.Abs(float64(Float32FromFP8(best))-a)
		if d < db || (d == db && c&1 == 0 && best&1 == 1) {
			best = c
		}
	}
	return sign | best
}

func TestFP8RoundsToNearestEvenAndSaturates(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	check := func(f float32) {
		if got, want := FP8FromFloat32(f), fp8Nearest(f); got != want {
			t.Fatalf("FP8FromFloat32(%g) = %#02x (%g), want %#02x (%g)", f, got, Float32FromFP8(got), want, Float32FromFP8(want))
		}
	}
	for i := 0; i < 20000; i++ {
		check(float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(24)-14))))
	}
	// Every midpoint between neighbouring codes, and a hair either side.
	for c := 0; c < 0x7e; c++ {
		m := (float64(Float32FromFP8(uint8(c))) + float64(Float32FromFP8(uint8(c+1)))) / 2
		for _, f := range []float32{float32(m), math.Nextafter32(float32(m), 0), math.Nextafter32(float32(m), 1000)} {
			check(f)
			check(-f)
		}
	}
	for _, tc := range []struct {
		in   float32
		want uint8
	}{
		{449, 0x7e}, {1e9, 0x7e}, {-1e9, 0xfe},
		{float32(math.Inf(1)), 0x7e}, {float32(math.Inf(-1)), 0xfe},
		{float32(math.NaN()), 0x7f}, {float32(math.Copysign(0, -1)), 0x80},
		{1.0 / 1024, 0x00},       // half the smallest subnormal: tie to even (0)
		{3.0 / 1024, 0x02},       // 1.5 subnormal steps: tie to even (2)
		{464, 0x7e}, {447, 0x7e}, // 464 is the tie to the NaN code: saturates
	} {
		if got := FP8FromFloat32(tc.in); got != tc.want {
			t.Errorf("FP8FromFloat32(%g) = %#02x, want %#02x", tc.in, got, tc.want)
		}
	}
}

func TestRowCodecsMatchRound(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, d := range []kernelspec.Dtype{kernelspec.BF16, kernelspec.FP8, kernelspec.F32} {
		for n := 0; n < 11; n++ {
			x := make([]float32, n)
			q := make([]float32, n)
			for i := range x {
				x[i] = float32(r.NormFloat64() * 3)
				q[i] = float32(r.NormFloat64())
			}
			row := make([]byte, n*d.Size())
			encodeRow(d, row, x)
			back := make([]float32, n)
			decodeRow(d, back, row)
			want := append([]float32(nil), x...)
			Round(d, want)
			for i := range want {
				if math.Float32bits(back[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%v n=%d: decode(encode(x))[%d] = %g, Round = %g", d, n, i, back[i], want[i])
				}
			}
			if d == kernelspec.BF16 {
				q2 := randVec(r, n, 1)
				ga, gb := dot2BF16(q, q2, row)
				if math.Float32bits(ga) != math.Float32bits(Dot(q, want)) || math.Float32bits(gb) != math.Float32bits(Dot(q2, want)) {
					t.Fatalf("n=%d: dot2BF16 = %g, %g; Dot = %g, %g", n, ga, gb, Dot(q, want), Dot(q2, want))
				}
				ya, yb := randVec(r, n, 1), randVec(r, n, 1)
				wa, wb := append([]float32(nil), ya...), append([]float32(nil), yb...)
				axpy2BF16(ya, yb, 0.3, -1.7, row)
				Axpy(wa, 0.3, want)
				Axpy(wb, -1.7, want)
				if sameBits(ya, wa) >= 0 || sameBits(yb, wb) >= 0 {
					t.Fatalf("n=%d: axpy2BF16 differs from Axpy", n)
				}
			}
			if d == kernelspec.FP8 {
				if got, w := dotFP8(q, row), Dot(q, want); math.Float32bits(got) != math.Float32bits(w) {
					t.Fatalf("n=%d: dotFP8 = %g, Dot = %g", n, got, w)
				}
			}
		}
	}
}
