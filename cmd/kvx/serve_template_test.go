package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestServeChatTemplateFile: with --chat-template, /v1/chat/completions
// gives the tokens of a completion of the template's rendering (a
// Llama-3-style and a ChatML template, written in plugins/model/chat/testdata);
// messages the template refuses (raise_exception) are a 400 that says why.
func TestServeChatTemplateFile(t *testing.T) {
	chat := `{"max_tokens":5,"messages":[{"role":"system","content":" Be brief. "},{"role":"user","content":"Hello"}]}`
	for _, c := range []struct {
		file, rendered, refused, why string
	}{
		{"llama3.jinja", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\n",
			`{"messages":[{"role":"tool","content":"42"}]}`, "refused the messages: role tool is not supported by this template"},
		{"chatml.jinja", "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
			`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`, "conversation roles must alternate"},
	} {
		t.Run(c.file, func(t *testing.T) {
			base := startServe(t, genScenario, serveOpts{template: filepath.Join("../../plugins/model/chat/testdata", c.file)})
			code, v, _ := post(t, base+"/v1/chat/completions", chat)
			if code != 200 {
				t.Fatalf("chat: %d %v", code, v)
			}
			got := parseAnswer(t, v, true)
			body, _ := json.Marshal(map[string]any{"prompt": c.rendered, "max_tokens": 5})
			_, pv, _ := post(t, base+"/v1/completions", string(body))
			want := parseAnswer(t, pv, false)
			if !slices.Equal(got.ids, want.ids) || num(got.usage["prompt_tokens"]) != num(want.usage["prompt_tokens"]) {
				t.Errorf("chat: %v (%v prompt tokens); the rendered template as a prompt: %v (%v)", got.ids, got.usage["prompt_tokens"], want.ids, want.usage["prompt_tokens"])
			}
			code, v, _ = post(t, base+"/v1/chat/completions", c.refused)
			e, _ := v["error"].(map[string]any)
			if msg, _ := e["message"].(string); code != 400 || e["code"] != "chat_template_error" || e["param"] != "messages" || !strings.Contains(msg, c.why) || !strings.Contains(msg, c.file) {
				t.Errorf("refused messages: %d %v, want 400 chat_template_error naming the template and %q", code, v, c.why)
			}
		})
	}
}

// TestServeCheckpointChatTemplate: a checkpoint directory's
// tokenizer_config.json chat_template is applied, its bos_token written by
// the template and not added again by the tokenizer; a chat_template that
// does not parse stops kvx serve (exit 2) naming the file.
func TestServeCheckpointChatTemplate(t *testing.T) {
	data, err := os.ReadFile(ckptTokenize)
	if err != nil {
		t.Fatal(err)
	}
	cfg := checkpointWithTokenizer(t, data)
	dir := filepath.Dir(cfg)
	tc := `{"bos_token": "<|begin_of_text|>", "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(tc), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startServe(t, cfg, serveOpts{})
	code, v, _ := post(t, base+"/v1/chat/completions", `{"max_tokens":4,"messages":[{"role":"user","content":"hello"},{"role":"user","content":" world"}]}`)
	if code != 200 {
		t.Fatalf("chat: %d %v", code, v)
	}
	got := parseAnswer(t, v, true)
	_, pv, _ := post(t, base+"/v1/completions", `{"prompt":[30,20,25],"max_tokens":4}`) // <|begin_of_text|> hello Ġworld
	want := parseAnswer(t, pv, false)
	if n := num(got.usage["prompt_tokens"]); n != 3 || !slices.Equal(got.ids, want.ids) {
		t.Errorf("chat through the checkpoint's template: %d prompt tokens, %v; want 3 (one BOS) and %v", n, got.ids, want.ids)
	}

	bad := `{"chat_template": "{% for m in messages %}{{ m.content }}"}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := kvx(t, "serve", "-c", cfg, "--port", "0")
	if code != 2 || !strings.Contains(stderr, "tokenizer_config.json's chat_template) does not parse") {
		t.Errorf("a chat_template that does not parse: exit %d\n%s%s", code, out, stderr)
	}
	out, stderr, code = kvx(t, "serve", "-c", cfg, "--port", "0", "--drain-timeout", "-1s")
	if code != 2 || !strings.Contains(stderr, "--drain-timeout -1s: must be >= 0") {
		t.Errorf("a negative --drain-timeout: exit %d\n%s%s", code, out, stderr)
	}
}

// TestServeHostileTemplate (issue 24): a chat template that recurses
// without end on some messages used to kill kvx serve (a fatal Go stack
// overflow); now that request is a 400 naming the limit and the server
// goes on serving. A template that cannot render a minimal conversation
// is refused at start.
func TestServeHostileTemplate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "boom.jinja")
	tpl := `{% macro f() %}{{ f() }}{% endmacro %}{% for m in messages %}{% if m.content == 'boom' %}{{ f() }}{% endif %}{{ m.content }}{% endfor %}`
	if err := os.WriteFile(file, []byte(tpl), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startServe(t, genScenario, serveOpts{template: file})
	code, v, _ := post(t, base+"/v1/chat/completions", `{"max_tokens":2,"messages":[{"role":"user","content":"boom"}]}`)
	e, _ := v["error"].(map[string]any)
	if msg, _ := e["message"].(string); code != 400 || !strings.Contains(msg, "MaxTemplateFrames") {
		t.Errorf("recursing request: %d %v, want a 400 naming MaxTemplateFrames", code, v)
	}
	if code, v, _ := post(t, base+"/v1/chat/completions", `{"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`); code != 200 {
		t.Errorf("the next request: %d %v, want 200 (the server goes on)", code, v)
	}

	bad := filepath.Join(dir, "always.jinja")
	if err := os.WriteFile(bad, []byte(`{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &globals{configs: []string{genScenario}, sets: []string{"isolation=inprocess"}, logLevel: "error"}
	err = runServe(context.Background(), g, &serveOpts{template: bad}, ln, func(string) { t.Error("serve started with a template that never renders") })
	if err == nil || !strings.Contains(err.Error(), "does not render a minimal conversation") {
		t.Errorf("serve with a template that never renders: %v, want it refused at start", err)
	}
}
