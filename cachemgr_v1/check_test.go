package cachemgrv1

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestCheckNamesALeakedBlock: a block taken off the free list and put in
// no table (leaked) is named by the self-check, in a pool with blocks in use,
// whether the leak is the only thing wrong or comes with another violation
// (checkPool names leaked blocks only when its counts do not add up, or
// something else was found).
func TestCheckNamesALeakedBlock(t *testing.T) {
	for _, also := range []string{"", "a stale refcount"} {
		t.Run("also="+also, func(t *testing.T) {
			m := configured(t, smallConfig(4, 16))
			mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: 8, Prompt: make([]int32, 8)})
			commit(t, m, 1, 8)
			noViolations(t, m)
			p := m.paged[0]
			leaked := p.free[len(p.free)-1]
			p.free = p.free[:len(p.free)-1]
			if also != "" {
				p.ref[p.free[0]]++
			}
			want := fmt.Sprintf("pool %d: block %d is unreferenced but neither free nor cached (leaked)", p.id, leaked)
			if v := inspect(t, m).Violations; !slices.Contains(v, want) {
				t.Errorf("violations %q: want %q", v, want)
			}
		})
	}
}
