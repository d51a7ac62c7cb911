package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/gonum/mat"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// FitPoint is one measured forward: its kernels (Stage.Record) and the
// seconds it took.
type FitPoint struct {
	Features []Feature
	Measured float64
}

// FitResult is what Fit found.
type FitResult struct {
	Calibration spec.SimCalibration // Name left empty: the caller names it
	// Iterations of the alternating fit (see Fit) until the binding sides
	// stopped changing, or the cap.
	Iterations int
	// Unbound lists "class.compute" or "class.memory" for each side that
	// bound no kernel of the points: its scale is the largest value that
	// keeps every kernel of the class on the side it was measured on.
	Unbound []string
}

// Fit fits a calibration to measured forwards, minimising the squared
// relative error of Predict (each point weighs by 1/Measured, so a 1 ms
// decode counts as much as a 1 s prefill).
//
// Predict is a max of two linear terms per kernel, which no linear fit
// takes directly, so Fit alternates: given which side binds each kernel
// (first: the datasheet roofline's), Predict is linear in the unknowns (per
// class a compute and a memory scale, the launch cost per kernel, the step
// cost), solved by nonnegative least squares (Lawson-Hanson over gonum's
// SVD); then each kernel's binding side is recomputed with the new scales.
// It stops when no side changes (at most 50 rounds) and keeps the best
// round by the error of the real max formula. The alternation finds a local
// optimum, so it runs from four starts (the datasheet roofline's sides, all
// compute, all memory, and a fit of both sides summed) and keeps the best.
//
// Errors: no points, a point whose Measured is not finite and > 0, or
// fewer points than unknowns.
func Fit(points []FitPoint) (FitResult, error) {
	if len(points) == 0 {
		return FitResult{}, fmt.Errorf("calibration fit: no points")
	}
	var classes []string
	for i, p := range points {
		if !(p.Measured > 0) || math.IsInf(p.Measured, 0) {
			return FitResult{}, fmt.Errorf("calibration fit: point %d: measured %g s must be finite and > 0", i, p.Measured)
		}
		for _, f := range p.Features {
			if !slices.Contains(classes, f.Class) {
				classes = append(classes, f.Class)
			}
		}
	}
	// The memory class (the embedding gather) shares gemm's scales: its
	// bytes grow with the tokens as the gemms' FLOPs do, so on its own it
	// would be a second name for the same slope.
	tied := slices.Contains(classes, ClassNameGEMM) && slices.Contains(classes, ClassNameMemory)
	if tied {
		classes = slices.DeleteFunc(classes, func(c string) bool { return c == ClassNameMemory })
	}
	slices.Sort(classes)
	idx := map[string]int{}
	for i, c := range classes {
		idx[c] = i
	}
	if tied {
		idx[ClassNameMemory] = idx[ClassNameGEMM]
	}
	nc := len(classes)
	n := 2*nc + 2 // compute and memory scale per class, launch, step
	if len(points) < n {
		return FitResult{}, fmt.Errorf("calibration fit: %d points for %d unknowns (%d kernel classes); measure at least %d", len(points), n, nc, n)
	}
	f := &fitter{points: points, classes: classes, idx: idx, tied: tied}
	// Starts: the datasheet roofline's binding sides; every kernel compute
	// bound; every kernel memory bound; and the sides of a fit in which
	// both sides of every kernel add up (no max), which sees each class's
	// two slopes at once. The best end wins.
	ones, computeOnly, memoryOnly := make([]float64, n), make([]float64, n), make([]float64, n)
	for c := range nc {
		ones[2*c], ones[2*c+1] = 1, 1
		computeOnly[2*c] = 1
		memoryOnly[2*c+1] = 1
	}
	var best FitResult
	bestErr := math.Inf(1)
	for _, x0 := range [][]float64{ones, computeOnly, memoryOnly, f.sumFit()} {
		res, e := f.run(x0)
		if e < bestErr {
			best, bestErr = res, e
		}
	}
	return best, nil
}

type fitter struct {
	points  []FitPoint
	classes []string       // one per column pair
	idx     map[string]int // class -> column pair (memory shares gemm's when tied)
	tied    bool
}

// rows fills a (weighted by 1/Measured) and b (all 1) for the linear fit in
// which kernel j of point i is charged its compute side when
// compute(i, j), its memory side when memory(i, j) (both may hold).
func (f *fitter) rows(compute, memory func(i, j int) bool) (*mat.Dense, []float64) {
	nc := len(f.classes)
	n := 2*nc + 2
	launchCol, stepCol := 2*nc, 2*nc+1
	a := mat.NewDense(len(f.points), n, nil)
	b := make([]float64, len(f.points))
	for i, p := range f.points {
		w := 1 / p.Measured
		for j, k := range p.Features {
			c := f.idx[k.Class]
			if compute(i, j) {
				a.Set(i, 2*c, a.At(i, 2*c)+w*k.Count*k.ComputeSeconds)
			}
			if memory(i, j) {
				a.Set(i, 2*c+1, a.At(i, 2*c+1)+w*k.Count*k.MemorySeconds)
			}
			a.Set(i, launchCol, a.At(i, launchCol)+w*k.Count)
		}
		a.Set(i, stepCol, w)
		b[i] = 1
	}
	return a, b
}

// sumFit is the scales of the fit that charges every kernel both sides.
func (f *fitter) sumFit() []float64 {
	both := func(int, int) bool { return true }
	x, _ := nnls(f.rows(both, both))
	return x
}

// run alternates from scales x0 (see Fit) and returns its best round and
// that round's squared relative error.
func (f *fitter) run(x0 []float64) (FitResult, float64) {
	points, classes, idx := f.points, f.classes, f.idx
	x := slices.Clone(x0)
	// side[i][j]: kernel j of point i is compute bound.
	side := make([][]bool, len(points))
	for i, p := range points {
		side[i] = make([]bool, len(p.Features))
	}
	assign := func() bool {
		changed := false
		for i, p := range points {
			for j, k := range p.Features {
				c := idx[k.Class]
				cb := k.ComputeSeconds*x[2*c] >= k.MemorySeconds*x[2*c+1]
				if cb != side[i][j] {
					changed = true
				}
				side[i][j] = cb
			}
		}
		return changed
	}
	assign()
	var best FitResult
	bestErr := math.Inf(1)
	rounds := 0
	for rounds < 50 {
		rounds++
		sol, used := nnls(f.rows(func(i, j int) bool { return side[i][j] }, func(i, j int) bool { return !side[i][j] }))
		res := FitResult{Iterations: rounds}
		copy(x, sol)
		// A side that bound nothing: the largest scale that keeps every
		// kernel of its class on the other side.
		for c, name := range classes {
			for s, label := range []string{"compute", "memory"} {
				if used[2*c+s] {
					continue
				}
				bound := math.Inf(1)
				for _, p := range points {
					for _, k := range p.Features {
						if idx[k.Class] != c {
							continue
						}
						this, other := k.ComputeSeconds, k.MemorySeconds*x[2*c+1]
						if s == 1 {
							this, other = k.MemorySeconds, k.ComputeSeconds*x[2*c]
						}
						if this > 0 {
							bound = min(bound, other/this)
						}
					}
				}
				if math.IsInf(bound, 1) {
					bound = 1 // the class has no work on this side at all
				}
				x[2*c+s] = bound
				res.Unbound = append(res.Unbound, name+"."+label)
			}
		}
		res.Calibration = toCalibration(classes, x, f.tied)
		if e := sqErr(&res.Calibration, points); e < bestErr {
			best, bestErr = res, e
		}
		if !assign() {
			break
		}
	}
	best.Iterations = rounds
	return best, bestErr
}

func toCalibration(classes []string, x []float64, tied bool) spec.SimCalibration {
	c := spec.SimCalibration{LaunchSeconds: x[2*len(classes)], StepSeconds: x[2*len(classes)+1]}
	for i, name := range classes {
		c.Classes = append(c.Classes, spec.KernelClassScale{Class: name, ComputeScale: x[2*i], MemoryScale: x[2*i+1]})
		if tied && name == ClassNameGEMM {
			c.Classes = append(c.Classes, spec.KernelClassScale{Class: ClassNameMemory, ComputeScale: x[2*i], MemoryScale: x[2*i+1]})
		}
	}
	slices.SortFunc(c.Classes, func(a, b spec.KernelClassScale) int { return strings.Compare(a.Class, b.Class) })
	return c
}

func sqErr(c *spec.SimCalibration, points []FitPoint) float64 {
	var s float64
	for _, p := range points {
		r := (Predict(c, p.Features) - p.Measured) / p.Measured
		s += r * r
	}
	return s
}

// RelErrors returns |Predict - Measured| / Measured of every point, in order.
func RelErrors(c *spec.SimCalibration, points []FitPoint) []float64 {
	out := make([]float64, len(points))
	for i, p := range points {
		out[i] = math.Abs(Predict(c, p.Features)-p.Measured) / p.Measured
	}
	return out
}

// nnls solves min |a x - b| subject to x >= 0 (Lawson and Hanson, "Solving
// Least Squares Problems", 1974, chapter 23) and says which unknowns had any
// data: a column of zeros is left at 0 and reported false. Columns are
// scaled to unit norm inside, so unknowns of very different magnitudes
// (seconds per FLOP and seconds per step) are treated alike.
func nnls(a *mat.Dense, b []float64) ([]float64, []bool) {
	m, n := a.Dims()
	norms := make([]float64, n)
	used := make([]bool, n)
	as := mat.DenseCopyOf(a)
	for j := range n {
		norms[j] = mat.Norm(as.ColView(j), 2)
		if norms[j] > 0 {
			used[j] = true
			for i := range m {
				as.Set(i, j, as.At(i, j)/norms[j])
			}
		}
	}
	bv := mat.NewVecDense(m, slices.Clone(b))
	x := make([]float64, n)
	passive := make([]bool, n)
	grad := func() []float64 {
		r := mat.NewVecDense(m, nil)
		r.MulVec(as, mat.NewVecDense(n, slices.Clone(x)))
		r.SubVec(bv, r)
		g := mat.NewVecDense(n, nil)
		g.MulVec(as.T(), r)
		return g.RawVector().Data
	}
	const tol = 1e-12
	for outer := 0; outer < 3*n; outer++ {
		w := grad()
		j, wmax := -1, tol
		for k := range n {
			if used[k] && !passive[k] && w[k] > wmax {
				j, wmax = k, w[k]
			}
		}
		if j < 0 {
			break
		}
		passive[j] = true
		for inner := 0; inner < 3*n; inner++ {
			z := lstsq(as, bv, passive)
			ok := true
			for k := range n {
				if passive[k] && z[k] <= tol {
					ok = false
				}
			}
			if ok {
				copy(x, z)
				break
			}
			alpha := math.Inf(1)
			for k := range n {
				if passive[k] && z[k] <= tol {
					alpha = min(alpha, x[k]/(x[k]-z[k]))
				}
			}
			for k := range n {
				x[k] += alpha * (z[k] - x[k])
				if passive[k] && x[k] <= tol {
					passive[k], x[k] = false, 0
				}
			}
		}
	}
	for j := range n {
		if norms[j] > 0 {
			x[j] /= norms[j]
		}
	}
	return x, used
}

// lstsq solves the unconstrained least squares over the passive columns by
// SVD (rank-revealing: nearly dependent columns do not blow up) and returns
// a full-length vector with zeros elsewhere.
func lstsq(a *mat.Dense, b *mat.VecDense, passive []bool) []float64 {
	m, n := a.Dims()
	var cols []int
	for j := range n {
		if passive[j] {
			cols = append(cols, j)
		}
	}
	sub := mat.NewDense(m, len(cols), nil)
	for k, j := range cols {
		for i := range m {
			sub.Set(i, k, a.At(i, j))
		}
	}
	var svd mat.SVD
	out := make([]float64, n)
	if !svd.Factorize(sub, mat.SVDThin) {
		return out
	}
	vals := svd.Values(nil)
	rank := 0
	for _, v := range vals {
		if v > 1e-10*vals[0] {
			rank++
		}
	}
	if rank == 0 {
		return out
	}
	var z mat.Dense
	svd.SolveTo(&z, b, rank)
	for k, j := range cols {
		out[j] = z.At(k, 0)
	}
	return out
}
