package gpumem

import (
	"errors"
	"testing"
)

// On a machine without a GPU (CI) Query fails with ErrUnavailable; on one
// with a GPU it reports a sane memory split. Either way an index past the
// last GPU is ErrNoGPU or ErrUnavailable, never a panic.
func TestQuery(t *testing.T) {
	info, err := Query(0)
	if err != nil {
		if !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrNoGPU) {
			t.Fatalf("Query(0) = %v, want an error wrapping ErrUnavailable or ErrNoGPU", err)
		}
		t.Logf("no GPU here: %v", err)
	} else if info.Name == "" || info.Total <= 0 || info.Free < 0 || info.Free > info.Total {
		t.Errorf("Query(0) = %+v, want a name and 0 <= free <= total > 0", info)
	}
	if _, err := Query(1 << 20); err == nil || !(errors.Is(err, ErrNoGPU) || errors.Is(err, ErrUnavailable)) {
		t.Errorf("Query(1<<20) = %v, want an error wrapping ErrNoGPU or ErrUnavailable", err)
	}
}
