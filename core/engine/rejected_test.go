package engine_test

import (
	"testing"

	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
)

// TestRejectedRequestsCountNoTokens: a request the scheduler rejects (longer
// than max_seq_len) and one rejected while it was read (workload.Request
// .Rejected, no prompt) both appear as rejections, and neither counts in
// the prompt tokens.
func TestRejectedRequestsCountNoTokens(t *testing.T) {
	wl := genWorkload(t, 6, 0)
	wl.Requests[2].OutputLen = 5000
	wl.Requests[4].Prompt, wl.Requests[4].Rejected = nil, "trace line 5: too long"
	var want int64
	for i, r := range wl.Requests {
		if i != 2 && i != 4 {
			want += int64(len(r.Prompt))
		}
	}
	s := buildSpec(t, testSpec{pp: 2, draft: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048})
	rep := runSpec(t, s, v1Launcher())
	if rep.Requests.Rejected != 2 || rep.Requests.Completed != 4 || len(rep.Requests.Rejections) != 2 {
		t.Fatalf("requests = %+v, want 2 rejected and 4 completed", rep.Requests)
	}
	if rep.Tokens.Prompt != want {
		t.Errorf("prompt tokens = %d, want %d (the completed requests' only)", rep.Tokens.Prompt, want)
	}
	reasons := map[uint64]string{}
	for _, rj := range rep.Requests.Rejections {
		reasons[rj.ID] = rj.Reason
	}
	if reasons[wl.Requests[4].ID] != "trace line 5: too long" || reasons[wl.Requests[2].ID] == "" {
		t.Errorf("rejections = %+v, want requests %d and %d with their reasons", rep.Requests.Rejections, wl.Requests[2].ID, wl.Requests[4].ID)
	}
}

// TestRejectedOnlyWorkloadFinishes: a closed loop whose every request was
// rejected while read ends at once with all of them rejected.
func TestRejectedOnlyWorkloadFinishes(t *testing.T) {
	wl := workload.Workload{Concurrency: 2}
	for i := range 3 {
		wl.Requests = append(wl.Requests, workload.Request{ID: uint64(i), OutputLen: 4, Rejected: "too long"})
	}
	s := buildSpec(t, testSpec{pp: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048})
	rep := runSpec(t, s, v1Launcher())
	if rep.Requests.Rejected != 3 || rep.Tokens.Prompt != 0 {
		t.Errorf("requests = %+v, prompt tokens %d; want 3 rejected, 0 tokens", rep.Requests, rep.Tokens.Prompt)
	}
}
