package chat

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// renderLimit renders text over one user message and returns the limit
// it stopped at ("" when it rendered).
func renderLimit(t *testing.T, name, text string) (string, error) {
	t.Helper()
	c, err := Parse(name, text, "", "")
	if err != nil {
		return "", err
	}
	start := time.Now()
	_, err = c.Render([]Message{{"user", "hi"}})
	if d := time.Since(start); d > MaxTemplateTime+2*time.Second {
		t.Errorf("%s: the render took %v, past MaxTemplateTime %v", name, d, MaxTemplateTime)
	}
	var le *TemplateLimitError
	if errors.As(err, &le) {
		return le.Limit, err
	}
	return "", err
}

// TestTemplateLimits is the regression test of issue 24: a chat template
// that recursed without end killed kvx serve (a Go stack overflow is
// fatal), one that looped a billion times held its request past 30 s.
// Each now fails its own render, quickly, naming the limit, and the
// process goes on (this test surviving is that).
func TestTemplateLimits(t *testing.T) {
	for _, c := range []struct{ name, text, limit string }{
		{"recursive-macro", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, "MaxTemplateFrames"},
		{"mutual-recursion", `{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}`, "MaxTemplateFrames"},
		{"recursive-block", `{% block x %}{{ self.x() }}{% endblock %}`, "MaxTemplateFrames"},
		{"billion-loop", `{% for i in range(1000000000) %}x{% endfor %}`, "MaxTemplateRange"},
		{"nested-loops", `{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}`, "MaxTemplateSteps|MaxTemplateTime"},
		{"slow-loops", `{% for a in range(100000) %}{% for b in range(100000) if false %}{% endfor %}{% endfor %}`, "MaxTemplateTime"},
		{"output", `{% for a in range(1000) %}{% for b in range(100) %}` + strings.Repeat("y", 1000) + `{% endfor %}{% endfor %}`, "MaxTemplateOutput"},
		{"macro-output", `{% macro m() %}{% for a in range(1000) %}{% for b in range(100) %}` + strings.Repeat("y", 1000) + `{% endfor %}{% endfor %}{% endmacro %}{% set x = m() %}`, "MaxTemplateOutput"},
		{"with-loop", `{% with %}{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}{% endwith %}`, "MaxTemplateSteps|MaxTemplateTime"},
		{"filter-loop", `{% filter upper %}{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}{% endfilter %}`, "MaxTemplateSteps|MaxTemplateTime"},
		{"set-block-loop", `{% set x %}{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}{% endset %}`, "MaxTemplateSteps|MaxTemplateTime"},
		{"namespace-cycle", `{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}`, ""},
		{"dict-cycle", `{% set ns = namespace(l=[]) %}{% set ns.l = [1, {'k': ns}] %}{{ ns }}`, ""},
		{"string-times", `{{ 'x' * 100000000000 }}`, "MaxTemplateOutput"},
		{"string-times-in-call", `{% macro m(a) %}{{ a }}{% endmacro %}{{ m(a=('ab' * 10000000)) }}`, "MaxTemplateOutput"},
		{"string-times-in-set", `{% set x = 'ab' * (100000 * 100000) %}`, "MaxTemplateOutput"},
		{"doubling", `{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}`, "MaxTemplateOutput"},
		{"shadow", `{% set ` + budgetKey + ` = 1 %}{% for m in messages %}{{ m.content }}{% endfor %}`, ""},
	} {
		limit, err := renderLimit(t, c.name, c.text)
		// "A|B": either (a loop's steps run ~7 µs each, so on a loaded
		// machine the time limit may come first).
		want := c.limit
		if a, b, ok := strings.Cut(c.limit, "|"); ok && limit == b {
			want = b
		} else if ok {
			want = a
		}
		if limit != want || err == nil || (want != "" && !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: Render = %v (limit %q), want an error naming %q", c.name, err, limit, c.limit)
		}
	}
	big := strings.Repeat("a", MaxTemplateBytes+1)
	if _, err := Parse("big", big, "", ""); err == nil || !strings.Contains(err.Error(), "MaxTemplateBytes") {
		t.Errorf("Parse(%d bytes) = %v, want MaxTemplateBytes named", len(big), err)
	}
	// Multiplication and ~ keep gonja's meaning.
	m, err := Parse("mul", `{{ 3 * 4 }} {{ 1.5 * 2 }} {{ 'ab' * 3 }} {{ 'a' * -1 }}|{{ loop_ * 2 }}|{{ 'a' ~ 1 ~ none }}|{{ 2 * 'ab' }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.Render(nil); got != "12 3.0 ababab |0|a1|0" || err != nil {
		t.Errorf("mul render = %q, %v, want %q", got, err, "12 3.0 ababab |0|a1|0")
	}
	// A bounded range still works, forwards and backwards.
	c, err := Parse("range", `{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Render(nil); got != "012531" || err != nil {
		t.Errorf("range render = %q, %v, want 012531", got, err)
	}
}

// TestTemplateCheck: the real templates pass Check; a recursive one fails
// it, so that kvx serve refuses it at start.
func TestTemplateCheck(t *testing.T) {
	for _, f := range []string{"llama3.jinja", "chatml.jinja"} {
		if err := readTemplate(t, f, "").Check(); err != nil {
			t.Errorf("%s.Check() = %v", f, err)
		}
	}
	c, err := Parse("rec", `{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Check(); err == nil || !strings.Contains(err.Error(), "MaxTemplateFrames") {
		t.Errorf("recursive template Check() = %v, want MaxTemplateFrames", err)
	}
	file := filepath.Join(t.TempDir(), "rec.jinja")
	if err := os.WriteFile(file, []byte(`{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load("", file); err == nil || !strings.Contains(err.Error(), "does not render a minimal conversation") ||
		!strings.Contains(err.Error(), "MaxTemplateFrames") {
		t.Errorf("Load(a recursive template) = %v, want it refused naming MaxTemplateFrames", err)
	}
}

// FuzzChatTemplate parses and renders arbitrary template source over a
// fixed small conversation: no panic, no crash (stack overflow), and a
// render bounded in time by the limits.
func FuzzChatTemplate(f *testing.F) {
	for _, name := range []string{"llama3.jinja", "chatml.jinja"} {
		if data, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			f.Add(string(data))
		}
	}
	// Seeds that run to a limit (recursion, long loops) take up to
	// MaxTemplateTime each and starve the fuzzer: TestTemplateLimits has
	// them. These stop quickly.
	f.Add(`{% macro f(n) %}{% if n < 5 %}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}`)
	f.Add(`{% for m in messages recursive %}{% if loop.depth < 3 %}{{ loop(messages) }}{% endif %}{% endfor %}`)
	f.Add(`{% set ns = namespace(x=1) %}{% for m in messages %}{% set ns.x = ns.x + 1 %}{% endfor %}{{ ns.x }}`)
	msgs := []Message{{"system", "Be brief."}, {"user", "Hello"}, {"assistant", "Hi."}, {"user", "Why?"}}
	f.Fuzz(func(t *testing.T, text string) {
		c, err := Parse("fuzz", text, "<s>", "</s>")
		if err != nil {
			return
		}
		// The bound is wall time, with room for a loaded machine: a
		// fuzzing worker at low priority beside other builds was once
		// descheduled for 5 s in a render that takes 0.3 s alone. A
		// render that ignored MaxTemplateTime would still run past it.
		start := time.Now()
		out, err := c.Render(msgs)
		if d := time.Since(start); d > MaxTemplateTime+15*time.Second {
			t.Fatalf("Render took %v, past MaxTemplateTime", d)
		}
		if err == nil && len(out) > MaxTemplateOutput {
			t.Fatalf("Render gave %d bytes, above MaxTemplateOutput", len(out))
		}
	})
}

// TestTemplateLexerStops: a template on which gonja's lexer backs up too
// far (a number, a '.', then a rune of more than one byte that is not a
// letter) is refused at once: where the lexer stops advancing, naming the
// limit, instead of lexing until memory runs out (the fuzzer's crasher,
// kept in testdata/fuzz/FuzzChatTemplate); where it slices out of range,
// as an error, not a panic on the lexer's goroutine.
func TestTemplateLexerStops(t *testing.T) {
	for _, text := range []string{"{%\xee0.\ueab50\xf4", "{{ 0.\u2603 }}"} {
		done := make(chan error, 1)
		go func() {
			_, err := Parse("lexer", text, "", "")
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "stopped advancing") && !strings.Contains(err.Error(), "gonja panicked") {
				t.Errorf("Parse(%q): %v, want the lexer's limit or its panic as an error", text, err)
			}
			t.Logf("Parse(%q): %v", text, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("Parse(%q) did not return in 10 s", text)
		}
	}
	// The bound leaves every real template alone.
	for _, name := range []string{"llama3.jinja", "chatml.jinja"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lexTokens(string(data)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestTemplateCycles: a set that makes a namespace or dict contain itself
// fails the render (gonja would print it by recursing without end).
func TestTemplateCycles(t *testing.T) {
	for _, text := range []string{`{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}`,
		`{% set ns = namespace(l=[]) %}{% set ns.l = [1, {'k': ns}] %}{{ ns }}`} {
		c, err := Parse("cycle", text, "", "")
		if err == nil {
			_, err = c.Render(nil)
		}
		if err == nil || !strings.Contains(err.Error(), "contains itself") {
			t.Errorf("%s: %v, want a cycle error", text, err)
		}
	}
}

// TestTemplateShape: nesting that would make gonja's parser overflow the
// stack (fatal) is refused before parsing, naming the limit.
func TestTemplateShape(t *testing.T) {
	for _, c := range []struct{ name, text, limit string }{
		{"parens", "{{ " + strings.Repeat("(", 300000) + "1" + strings.Repeat(")", 300000) + " }}", "MaxTemplateTagTokens"},
		{"ifs", strings.Repeat("{%if 1%}", 50000) + strings.Repeat("{%endif%}", 50000), "MaxTemplateBlockDepth"},
		{"brackets", "{{ " + strings.Repeat("[", 400000) + " }}", "MaxTemplateTagTokens"},
		{"nots", "{{ " + strings.Repeat("not ", 200000) + "x }}", "MaxTemplateTagTokens"},
		{"sets", strings.Repeat("{% set x %}", 1000) + strings.Repeat("{% endset %}", 1000), "MaxTemplateBlockDepth"},
	} {
		_, err := Parse(c.name, c.text, "", "")
		var le *TemplateLimitError
		if !errors.As(err, &le) || le.Limit != c.limit {
			t.Errorf("%s: Parse = %.200v, want %s", c.name, err, c.limit)
		}
	}
	// Flat repetition is fine: 300 sibling ifs, assignments with =.
	if _, err := Parse("flat", strings.Repeat("{% if true %}x{% endif %}{% set y = 1 %}", 300), "", ""); err != nil {
		t.Errorf("300 sibling blocks: %v", err)
	}
}
