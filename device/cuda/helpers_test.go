//go:build cuda && cgo

package cuda

import (
	"math"
	"testing"

	"gorgonia.org/cu"
)

// newTestOps returns ops without a device (row-wise ops, weights) on the
// process's context, freed when the test ends. Call them inside on.
func newTestOps(t testing.TB) *ops {
	t.Helper()
	g, err := sharedGPU()
	if err != nil {
		t.Fatalf("no GPU: %v", err)
	}
	o := &ops{g: g, ar: &arena{g: g}, weights: new([]cu.DevicePtr)}
	t.Cleanup(func() {
		g.do(func() error {
			for _, w := range *o.weights {
				cu.MemFree(w)
			}
			o.ar.free()
			return nil
		})
	})
	return o
}

// on runs f on the context's goroutine (every op must run there) and fails
// the test with the ops' sticky error. f must not call t.Fatal (another
// goroutine); t.Error is fine.
func on(t testing.TB, o *ops, f func()) {
	t.Helper()
	o.g.do(func() error {
		f()
		return nil
	})
	if err := o.g.do(o.g.sync); err != nil {
		t.Fatalf("cuda: %v", err)
	}
	if o.err != nil {
		t.Fatalf("ops: %v", o.err)
	}
}

// hostTensor uploads data as an r × c tensor of o's arena without going
// through the ops under test.
func hostTensor(o *ops, data []float32, r, c int) *tensor {
	t := o.newTensor(r, c)
	if o.err == nil {
		o.fail(upload(t.p, data))
	}
	return t
}

// keptTensor uploads data as an r × c tensor that outlives arena resets
// (freed with o's weights).
func keptTensor(o *ops, data []float32, r, c int) *tensor {
	t := &tensor{r: r, c: c}
	p, err := o.g.alloc(t.bytes())
	o.fail(err)
	if err == nil {
		*o.weights = append(*o.weights, p)
		t.p = p
		o.fail(upload(p, data))
	}
	return t
}

// sameBits reports the first element where got and want differ in bits.
func sameBits(t testing.TB, name string, want, got []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, want %d", name, len(got), len(want))
		return
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s: first mismatch at %d of %d: got %v (%#08x), want %v (%#08x)",
				name, i, len(want), got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			return
		}
	}
}
