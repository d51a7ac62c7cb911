package cachemgrv2

import (
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestShrinkFix: the fix names what exceeds the fit, both when both do, and
// never a limit no request can run at ("lower max_seq_len to at most 0").
func TestShrinkFix(t *testing.T) {
	for _, tc := range []struct {
		seq, draft, chunk, fitBlocks int
		want                         string
	}{
		{8192, 1, 2048, 100, ", or lower max_seq_len to at most 6399"},
		{2048, 0, 8192, 100, ", or lower max_num_tokens to at most 6400"},
		{8192, 0, 8192, 100, ", or lower max_seq_len to at most 6400 and max_num_tokens to at most 6400"},
		{8192, 1, 2048, 0, ""},
		{8192, 64, 2048, 1, ""},
		{100, 0, 100, 100, ""},
	} {
		cfg := kvcache.Config{TokensPerBlock: 64, MaxSeqLen: tc.seq, MaxDraftTokens: tc.draft, MaxNumTokens: tc.chunk}
		if got := ShrinkFix(cfg, tc.fitBlocks); got != tc.want {
			t.Errorf("ShrinkFix(seq %d, draft %d, chunk %d, %d blocks) = %q, want %q", tc.seq, tc.draft, tc.chunk, tc.fitBlocks, got, tc.want)
		}
	}
}
