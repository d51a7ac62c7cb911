//go:build !cgo

package gpumem

import "fmt"

// Query fails: go-nvml needs cgo, and this binary was built without it
// (CGO_ENABLED=0).
func Query(index int) (Info, error) {
	return Info{}, fmt.Errorf("GPU %d: this kvx was built with CGO_ENABLED=0 and NVML needs cgo; rebuild with CGO_ENABLED=1: %w", index, ErrUnavailable)
}
