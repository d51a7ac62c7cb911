package workload

import (
	"errors"
	"strings"
	"testing"
)

// TestRetention: Retention reads a given priority and duration (seconds into
// ns) and refuses, naming the field, the value and the range, a priority
// outside [1, 100], a duration not > 0 and a duration without a priority.
func TestRetention(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	f64 := func(v float64) *float64 { return &v }
	if p, d, err := Retention(i64(80), f64(1.25)); err != nil || p != 80 || d != 1_250_000_000 {
		t.Errorf("Retention(80, 1.25 s) = %d, %d, %v; want 80, 1.25e9 ns", p, d, err)
	}
	if p, d, err := Retention(nil, nil); err != nil || p != 0 || d != 0 {
		t.Errorf("Retention(nil, nil) = %d, %d, %v; want 0, 0", p, d, err)
	}
	for _, tc := range []struct {
		p     *int64
		d     *float64
		field string
		msg   string
	}{
		{i64(0), nil, "retention_priority", "retention_priority = 0: must be in [1, 100]"},
		{i64(101), nil, "retention_priority", "retention_priority = 101: must be in [1, 100]"},
		{i64(50), f64(0), "retention_duration_s", "retention_duration_s = 0: must be a number of seconds > 0"},
		{i64(50), f64(1e12), "retention_duration_s", "<= 31536000"},
		{nil, f64(3), "retention_duration_s", "needs a retention_priority"},
	} {
		_, _, err := Retention(tc.p, tc.d)
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Field != tc.field || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Retention(%v, %v) = %v; want an *OptionError on %s saying %q", tc.p, tc.d, err, tc.field, tc.msg)
		}
	}
}

// TestWorkloadRetentionDefault: a request without its own priority takes
// the workload's; one with its own keeps it, duration included.
func TestWorkloadRetentionDefault(t *testing.T) {
	w := Workload{RetentionPriority: 60, RetentionDuration: 5}
	if p, d := w.Retention(Request{}); p != 60 || d != 5 {
		t.Errorf("default = %d, %d; want 60, 5", p, d)
	}
	if p, d := w.Retention(Request{RetentionPriority: 90}); p != 90 || d != 0 {
		t.Errorf("own = %d, %d; want 90, 0", p, d)
	}
	_, err := FromPrompts([]Prompt{{Tokens: []int32{1}, MaxTokens: 1}, {Tokens: []int32{1}, MaxTokens: 1, RetentionPriority: 200}}, 0)
	if err == nil || !strings.Contains(err.Error(), "prompts[1].retention_priority = 200") {
		t.Errorf("FromPrompts with priority 200: %v", err)
	}
}
