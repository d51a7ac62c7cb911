package serve

import (
	"encoding/json"
	"testing"
)

func TestHeldBackAndStopIndex(t *testing.T) {
	stops := []string{"STOP", "\n\n", "ab"}
	for _, tc := range []struct {
		text       string
		held, stop int
	}{
		{"hello", 0, -1},
		{"hello S", 1, -1},
		{"hello ST", 2, -1},
		{"hello STO", 3, -1},
		{"hello STOP", 0, 6},
		{"x\n", 1, -1},
		{"x\n\nSTOP", 0, 1},
		{"a", 1, -1},
		{"cab", 0, 1},
		{"", 0, -1},
	} {
		if got := heldBack(tc.text, stops); got != tc.held {
			t.Errorf("heldBack(%q) = %d, want %d", tc.text, got, tc.held)
		}
		if got := stopIndex(tc.text, stops); got != tc.stop {
			t.Errorf("stopIndex(%q) = %d, want %d", tc.text, got, tc.stop)
		}
	}
}

// A stream holds back what may begin a stop string and never sends it;
// the final text is cut before the stop string, or without a stop id's
// text; the deltas add up to the final text.
func TestTextStreamStops(t *testing.T) {
	ids := func(s string) []int32 {
		var out []int32
		for i := range len(s) {
			out = append(out, int32(s[i]))
		}
		return out
	}
	full := ids("say STOP now")
	ts := textStream{tok: byteTok{}, stops: []string{"STOP"}}
	var sent string
	for i := range full {
		if stopIndex(ts.all(full[:i+1]), ts.stops) >= 0 {
			sent += ts.next(full[:i+1], true, true)
			break
		}
		d := ts.next(full[:i+1], false, false)
		if i == 5 && d != "" { // "say ST": "ST" is held back
			t.Errorf("delta after %q = %q, want nothing", "say ST", d)
		}
		sent += d
	}
	if sent != "say " {
		t.Errorf("streamed %q, want %q", sent, "say ")
	}
	if got := FinalText(byteTok{}, ids("ok!"), nil, []int32{'!'}, true); got != "ok" {
		t.Errorf("FinalText with stop id '!' = %q, want %q", got, "ok")
	}
	if got := FinalText(byteTok{}, ids("ok!"), nil, []int32{'!'}, false); got != "ok!" {
		t.Errorf("FinalText not stopped = %q, want %q", got, "ok!")
	}
	m := StopMatcher(byteTok{}, []string{"ab"})
	if k, ok := m(ids("xxaby"), 0); !ok || k != 4 {
		t.Errorf("StopMatcher(xxaby) = %d %v, want 4 true", k, ok)
	}
	if _, ok := m(ids("xxa"), 0); ok {
		t.Errorf("StopMatcher(xxa) matched")
	}
}

func TestTolerated(t *testing.T) {
	for name := range TolerantFields {
		if !tolerated(name, json.RawMessage("null")) {
			t.Errorf("%s: null refused", name)
		}
		if tolerated(name, json.RawMessage(`{"x": [1]}`)) {
			t.Errorf("%s: a value that asks for something accepted", name)
		}
	}
	for name, v := range map[string]string{"logit_bias": "{ }", "tools": "[]", "tool_choice": `"none"`, "response_format": `{"type": "text"}`,
		"store": "false", "user": `"alice"`, "modalities": `[ "text" ]`} {
		if !tolerated(name, json.RawMessage(v)) {
			t.Errorf("%s = %s refused", name, v)
		}
	}
}
