package bench

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/core/report"
)

// FuzzReadEvents: whatever a server streams, readEvents returns (no panic,
// no hang) with the request completed or failed with a known kind and a
// reason; a completed stream counted no more token ids than tokens, and
// one inter-token gap per token after the first chunk's.
func FuzzReadEvents(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"text\":\"a\",\"token_ids\":[1,2]}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\ndata: [DONE]\n\n",
		": keep-alive\r\nevent: x\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n",
		"data: {\"error\":{\"message\":\"x\"}}\n\n",
		"data: [DONE]\n\n",
		"data: {\"choices\":[{\"text\":\n\n",
		"garbage\n\n",
		"data: {\"choices\":[{\"text\":\"a\"}]}\n",
		"data:{\"choices\":[{\"token_ids\":[]}]}\ndata:{}\n\n",
	} {
		f.Add([]byte(s), 4)
	}
	f.Fuzz(func(t *testing.T, b []byte, maxTokens int) {
		maxTokens = max(1, min(maxTokens, 1000))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r := readEvents(ctx, bytes.NewReader(b), maxTokens, &result{idsAll: true, sent: time.Now()})
		if !r.ok {
			if !slices.Contains(report.BenchErrorKinds, r.kind) || r.reason == "" {
				t.Fatalf("failed with kind %q reason %q, want a known kind and a reason", r.kind, r.reason)
			}
			return
		}
		if r.kind != "" || len(r.ids) > r.streamed || r.streamed < 0 {
			t.Fatalf("ok with kind %q, %d ids of %d tokens", r.kind, len(r.ids), r.streamed)
		}
		if r.streamed > 0 && len(r.itl) > r.streamed-1 {
			t.Fatalf("%d gaps for %d tokens", len(r.itl), r.streamed)
		}
		if !strings.Contains(string(b), "[DONE]") {
			t.Fatalf("ok without data: [DONE] in %q", b)
		}
	})
}
