package chat

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readTemplate(t *testing.T, name, bos string) *Template {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(name, string(text), bos, "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestChatTemplates: a Llama-3-style and a ChatML (Qwen) template render
// as transformers renders them (trim_blocks, lstrip_blocks): the messages
// loop, loop.index0 and loop.first-style tests, filters, bos_token,
// add_generation_prompt, a missing attribute (tool_calls) as false.
func TestChatTemplates(t *testing.T) {
	msgs := []Message{{"system", "  Be brief. "}, {"user", "Hello"}, {"assistant", "Hi."}, {"user", "Why?"}}
	cases := []struct {
		file, bos string
		msgs      []Message
		want      string
	}{
		{"llama3.jinja", "<|begin_of_text|>", msgs, "<|begin_of_text|>" +
			"<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\nHi.<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"chatml.jinja", "", msgs, "<|im_start|>system\n  Be brief. <|im_end|>\n<|im_start|>user\nHello<|im_end|>\n" +
			"<|im_start|>assistant\nHi.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"},
		{"chatml.jinja", "", msgs[1:2], "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" +
			"<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"},
	}
	for _, c := range cases {
		got, err := readTemplate(t, c.file, c.bos).Render(c.msgs)
		if err != nil || got != c.want {
			t.Errorf("%s.Render(%v) = %q, %v\nwant %q", c.file, c.msgs, got, err, c.want)
		}
	}
}

// TestChatTemplateErrors: a template's raise_exception is a TemplateError
// carrying its message; a template that breaks while rendering or does not
// parse says so, naming where it came from.
func TestChatTemplateErrors(t *testing.T) {
	_, err := readTemplate(t, "llama3.jinja", "").Render([]Message{{"tool", "42"}})
	var te *TemplateError
	if !errors.As(err, &te) || te.Raised != "role tool is not supported by this template" ||
		!strings.Contains(err.Error(), "the chat template (llama3.jinja) refused the messages: role tool") {
		t.Errorf("llama3 with a tool message: %v, want its raise_exception", err)
	}
	_, err = readTemplate(t, "chatml.jinja", "").Render([]Message{{"user", "a"}, {"user", "b"}})
	if !errors.As(err, &te) || !strings.Contains(te.Raised, "must alternate") || !strings.Contains(te.Raised, "message 1 is user") {
		t.Errorf("chatml with two user messages in a row: %v, want the alternation error", err)
	}
	bad, err := Parse("bad.jinja", "{{ messages[0]['content'] | no_such_filter }}", "", "")
	if err == nil {
		_, err = bad.Render([]Message{{"user", "a"}})
	}
	if err == nil || !strings.Contains(err.Error(), "bad.jinja") || !strings.Contains(err.Error(), "no_such_filter") {
		t.Errorf("an unknown filter: %v, want an error naming the template and the filter", err)
	}
	if _, err := Parse("open.jinja", "{% for m in messages %}{{ m.content }}", "", ""); err == nil || !strings.Contains(err.Error(), "open.jinja") {
		t.Errorf("an unclosed for: %v, want a parse error naming the template", err)
	}
	inc, err := Parse("inc.jinja", `{% include "/etc/passwd" %}`, "", "")
	if err == nil {
		var out string
		out, err = inc.Render([]Message{{"user", "a"}})
		if err == nil {
			t.Errorf("include of /etc/passwd rendered %q: a template must read no file", out)
		}
	}
}

// TestLoadChatTemplate: chat_template.jinja first, else tokenizer_config.json's
// chat_template (a string or named templates), bos_token as a string or an
// added token; none is nil; a malformed file is an error naming it.
func TestLoadChatTemplate(t *testing.T) {
	write := func(dir, name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	msgs := []Message{{"user", "hi"}}
	cases := []struct {
		files map[string]string
		want  string // rendered; "" for no template
		err   string
	}{
		{map[string]string{}, "", ""},
		{map[string]string{"tokenizer_config.json": `{"bos_token": "<s>"}`}, "", ""},
		{map[string]string{"tokenizer_config.json": `{"bos_token": "<s>", "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"}`}, "<s>[user] hi", ""},
		{map[string]string{"tokenizer_config.json": `{"bos_token": {"content": "<B>", "__type": "AddedToken"}, "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}]}`}, "<B>hi", ""},
		{map[string]string{"tokenizer_config.json": `{"chat_template": "ignored", "eos_token": "</s>"}`, "chat_template.jinja": "{{ messages[0].content }}{{ eos_token }}"}, "hi</s>", ""},
		{map[string]string{"tokenizer_config.json": `{"chat_template": [{"name": "tool_use", "template": "x"}]}`}, "", `no template named "default" (it has tool_use)`},
		{map[string]string{"tokenizer_config.json": `{"chat_template": 3}`}, "", "chat_template: want a string or a list"},
		{map[string]string{"tokenizer_config.json": `{"bos_token": 3}`}, "", "bos_token: want a string"},
		{map[string]string{"tokenizer_config.json": `{`}, "", "tokenizer_config.json"},
	}
	// --chat-template: the file, with the directory's special tokens.
	dir := t.TempDir()
	write(dir, "tokenizer_config.json", `{"bos_token": "<s>", "chat_template": "not this"}`)
	write(dir, "mine.jinja", "{{ bos_token }}{{ messages[0].content }}!")
	if ct, err := Load(dir, filepath.Join(dir, "mine.jinja")); err != nil || ct == nil {
		t.Errorf("Load with a file: %v %v", ct, err)
	} else if got, err := ct.Render(msgs); got != "<s>hi!" || err != nil {
		t.Errorf("the --chat-template file renders %q, %v, want <s>hi!", got, err)
	}
	if _, err := Load("", filepath.Join(dir, "none.jinja")); err == nil || !strings.Contains(err.Error(), "none.jinja") {
		t.Errorf("a missing --chat-template file: %v, want an error naming it", err)
	}
	for i, c := range cases {
		dir := t.TempDir()
		for n, text := range c.files {
			write(dir, n, text)
		}
		ct, err := Load(dir, "")
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("case %d: Load = %v, want an error containing %q", i, err, c.err)
			}
		case err != nil:
			t.Errorf("case %d: Load: %v", i, err)
		case c.want == "" && ct != nil:
			t.Errorf("case %d: a template (%s) where there is none", i, ct.Source)
		case c.want != "":
			if ct == nil {
				t.Errorf("case %d: no template, want one", i)
				continue
			}
			if got, err := ct.Render(msgs); err != nil || got != c.want {
				t.Errorf("case %d: Render = %q, %v, want %q", i, got, err, c.want)
			}
		}
	}
}
