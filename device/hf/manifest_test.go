package hf

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/kvx-dev/kvx/device/synth"
)

// device records the weights put on it (a synth.Loader), in order.
type device []weight

func (d *device) Weight(data []float32, rows, cols int) synth.Tensor {
	w := weight{rows, cols, len(data)}
	*d = append(*d, w)
	return w
}

// weight is a tensor on the device: rows × cols of n values.
type weight struct{ rows, cols, n int }

func (w weight) Rows() int      { return w.rows }
func (w weight) Cols() int      { return w.cols }
func (w weight) String() string { return fmt.Sprintf("%d×%d (%d values)", w.rows, w.cols, w.n) }

// manifestCheckpoint writes a checkpoint of a.weight [2 3], a.bias [2],
// conv [2 1 3] and head [4].
func manifestCheckpoint(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	err := WriteSafetensors(filepath.Join(dir, "model.safetensors"), []Named{
		{Name: "a.weight", Shape: []int{2, 3}, Data: make([]float32, 6)},
		{Name: "a.bias", Shape: []int{2}, Data: make([]float32, 2)},
		{Name: "conv", Shape: []int{2, 1, 3}, Data: make([]float32, 6)},
		{Name: "head", Shape: []int{4}, Data: make([]float32, 4)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestManifestCheck(t *testing.T) {
	dir := manifestCheckpoint(t)
	for _, c := range []struct {
		name    string
		declare func(*manifest)
		want    string // the whole error; "" for none
	}{
		{"all there", func(m *manifest) {}, ""},
		{"optional absent is fine", func(m *manifest) { m.allow("absent", 7) }, ""},
		{"missing", func(m *manifest) { m.linear("b", 1, 2, true) },
			`hf: checkpoint DIR: tensor "b.bias" is missing (want shape [1])`},
		{"extra", func(m *manifest) { delete(m.want, "conv") },
			`hf: checkpoint DIR: tensor "conv" (shape [2 1 3]) is not a tensor of TestForCausalLM with 2 layers`},
		{"mis-shaped wanted", func(m *manifest) { m.need("conv", 2, 3) },
			`hf: checkpoint DIR: tensor "conv" has shape [2 1 3], want [2 3]`},
		{"mis-shaped optional", func(m *manifest) { m.allow("head", 5) },
			`hf: checkpoint DIR: tensor "head" has shape [4], want [5]`},
		{"several mis-shaped: the first by name", func(m *manifest) { m.linear("a", 3, 2, true); m.need("conv", 6) },
			`hf: checkpoint DIR: tensor "a.bias" has shape [2], want [3]`},
		{"extra before missing", func(m *manifest) { delete(m.want, "conv"); m.need("b", 1) },
			`hf: checkpoint DIR: tensor "conv" (shape [2 1 3]) is not a tensor of TestForCausalLM with 2 layers`},
		{"wanted before optional", func(m *manifest) { m.allow("head", 5); m.need("conv", 6) },
			`hf: checkpoint DIR: tensor "conv" has shape [2 1 3], want [6]`},
	} {
		want := c.want
		if want != "" {
			want = "hf: checkpoint " + dir + want[len("hf: checkpoint DIR"):]
		}
		for range 20 { // map order must not choose the tensor named
			m, err := openManifest(dir, &device{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			m.linear("a", 2, 3, true)
			m.need("conv", 2, 1, 3)
			m.allow("head", 4)
			c.declare(m)
			err = m.check("TestForCausalLM", 2)
			m.close()
			if got := fmt.Sprint(err); (err == nil) != (want == "") || err != nil && got != want {
				t.Fatalf("%s: check = %v, want %q", c.name, err, want)
			}
		}
	}
}

func TestManifestLoad(t *testing.T) {
	dir := manifestCheckpoint(t)
	ops := &device{}
	m, err := openManifest(dir, ops, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	m.linear("a", 2, 3, true)
	m.need("conv", 2, 1, 3)
	m.allow("head", 4)
	m.allow("absent", 7)
	if err := m.check("TestForCausalLM", 1); err != nil {
		t.Fatal(err)
	}
	l := m.lin("a")
	if l.w == nil || l.b == nil {
		t.Errorf("lin(a) = %v, want weight and bias", l)
	}
	if m.load("conv") == nil || m.load("head") == nil {
		t.Errorf("load(conv), load(head): nil, want tensors")
	}
	if x := m.load("absent"); x != nil {
		t.Errorf("load(absent) = %v, want nil (an allowed tensor the checkpoint lacks)", x)
	}
	if x := m.host("undeclared"); x != nil {
		t.Errorf("host(undeclared) = %v, want nil", x)
	}
	want := []string{"2×3 (6 values)", "1×2 (2 values)", "2×3 (6 values)", "1×4 (4 values)"}
	if fmt.Sprint(*ops) != fmt.Sprint(want) {
		t.Errorf("weights put on the device: %v, want %v", *ops, want)
	}
	if err := m.err(); err != nil {
		t.Errorf("err() = %v, want nil", err)
	}

	// A read that fails (a shape the check would have refused): err keeps
	// the first.
	m.need("a.weight", 3, 2)
	m.need("a.bias", 5)
	if l := m.lin("a"); l.w != nil || l.b != nil {
		t.Errorf("lin(a) after failed reads = %v, want nils", l)
	}
	wantErr := fmt.Sprintf(`hf: checkpoint %s: tensor "a.weight" has shape [2 3], want [3 2]`, dir)
	if err := m.err(); fmt.Sprint(err) != wantErr {
		t.Errorf("err() = %v, want %q", err, wantErr)
	}
}
