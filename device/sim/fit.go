package sim

import (
	"fmt"
	"math"
	"slices"

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
// round by the error of the real max formula.
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
	slices.Sort(classes)
	idx := map[string]int{}
	for i, c := range classes {
		idx[c] = i
	}
	nc := len(classes)
	n := 2*nc + 2 // compute and memory scale per class, launch, step
	if len(points) < n {
		return FitResult{}, fmt.Errorf("calibration fit: %d points for %d unknowns (%d kernel classes); measure at least %d", len(points), n, nc, n)
	}
	launchCol, stepCol := 2*nc, 2*nc+1

	// side[i][j]: kernel j of point i is compute bound.
	side := make([][]bool, len(points))
	x := make([]float64, n)
	for c := range nc {
		x[2*c], x[2*c+1] = 1, 1
	}
	assign := func() bool {
		changed := false
		for i, p := range points {
			if side[i] == nil {
				side[i] = make([]bool, len(p.Features))
				changed = true
			}
			for j, f := range p.Features {
				c := idx[f.Class]
				cb := f.ComputeSeconds*x[2*c] >= f.MemorySeconds*x[2*c+1]
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
	a := mat.NewDense(len(points), n, nil)
	b := make([]float64, len(points))
	rounds := 0
	for rounds < 50 {
		rounds++
		a.Zero()
		for i, p := range points {
			w := 1 / p.Measured
			for j, f := range p.Features {
				c := idx[f.Class]
				if side[i][j] {
					a.Set(i, 2*c, a.At(i, 2*c)+w*f.Count*f.ComputeSeconds)
				} else {
					a.Set(i, 2*c+1, a.At(i, 2*c+1)+w*f.Count*f.MemorySeconds)
				}
				a.Set(i, launchCol, a.At(i, launchCol)+w*f.Count)
			}
			a.Set(i, stepCol, w)
			b[i] = 1
		}
		sol, used := nnls(a, b)
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
					for _, f := range p.Features {
						if f.Class != name {
							continue
						}
						this, other := f.ComputeSeconds, f.MemorySeconds*x[2*c+1]
						if s == 1 {
							this, other = f.MemorySeconds, f.ComputeSeconds*x[2*c]
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
		res.Calibration = toCalibration(classes, x)
		if e := sqErr(&res.Calibration, points); e < bestErr {
			best, bestErr = res, e
		}
		if !assign() {
			break
		}
	}
	best.Iterations = rounds
	return best, nil
}

func toCalibration(classes []string, x []float64) spec.SimCalibration {
	c := spec.SimCalibration{LaunchSeconds: x[2*len(classes)], StepSeconds: x[2*len(classes)+1]}
	for i, name := range classes {
		c.Classes = append(c.Classes, spec.KernelClassScale{Class: name, ComputeScale: x[2*i], MemoryScale: x[2*i+1]})
	}
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
