// Package chat reads and renders a model's chat template (a checkpoint's
// chat_template.jinja or tokenizer_config.json's chat_template, or a file),
// as transformers' apply_chat_template renders it, under limits that no
// template can pass (limits.go): a template is outside input. It is part of
// the one model description (plugins/model); only the host renders chats.
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// Template is a checkpoint's chat template: Jinja, rendered as
// transformers' apply_chat_template renders it (trim_blocks and
// lstrip_blocks on; the variables messages, add_generation_prompt,
// bos_token and eos_token; the function raise_exception). It is parsed
// once and safe for concurrent use. A template can read nothing but its
// variables: include, import and extends find no file.
type Template struct {
	Source   string // where it came from, for messages: "tokenizer_config.json's chat_template", a path
	tpl      *exec.Template
	bos, eos string
}

// templateConfig is transformers' Jinja environment: a block's first
// newline is removed, and the spaces before a block on its line.
var templateConfig = func() *config.Config {
	c := config.New()
	c.TrimBlocks, c.LeftStripBlocks = true, true
	return c
}()

const templateName = "/chat_template"

// Parse parses text (from source, named in errors) with the
// special tokens bos and eos.
// A template larger than MaxTemplateBytes, or with a tag or block nesting
// past MaxTemplateTagTokens or MaxTemplateBlockDepth, is refused before it
// is parsed (gonja's parser recurses on nesting); a panic in gonja's
// parser (it panics on some malformed tags) is an error too;
// the parsed one is given the checks that bound its renders (see
// MaxTemplateSteps).
func Parse(source, text, bos, eos string) (_ *Template, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("chat template (%s) does not parse: gonja panicked: %v", source, p)
		}
	}()
	if len(text) > MaxTemplateBytes {
		return nil, fmt.Errorf("chat template (%s) is %d bytes, above the limit MaxTemplateBytes = %d", source, len(text), MaxTemplateBytes)
	}
	if err := checkShape(text); err != nil {
		return nil, fmt.Errorf("chat template (%s): %w", source, err)
	}
	ld, err := loaders.NewMemoryLoader(map[string]string{templateName: text})
	if err != nil {
		return nil, err
	}
	tpl, err := exec.NewTemplate(templateName, templateConfig, ld, templateEnvironment)
	if err != nil {
		// gonja quotes the whole template in its message: name it instead.
		msg := strings.Replace(err.Error(), "'"+text+"'", templateName, 1)
		return nil, fmt.Errorf("chat template (%s) does not parse: %s", source, msg)
	}
	guardMultiply(tpl.Root())
	addTicks(tpl.Root())
	return &Template{Source: source, tpl: tpl, bos: bos, eos: eos}, nil
}

// CheckMessages is the conversation Check renders.
var CheckMessages = []Message{{Role: "system", Content: "You are a helpful assistant."}, {Role: "user", Content: "Hello."},
	{Role: "assistant", Content: "Hello! How can I help?"}, {Role: "user", Content: "What is 2 + 2?"}}

// Check renders CheckMessages once, so that a server can refuse at start
// a template that cannot render a minimal conversation (or passes a limit
// doing so) instead of failing every chat request. A template that refuses
// a system message (raise_exception) is tried again without it.
func (c *Template) Check() error {
	_, err := c.Render(CheckMessages)
	var te *TemplateError
	if errors.As(err, &te) && te.Raised != "" {
		_, err = c.Render(CheckMessages[1:])
	}
	return err
}

// Message is one chat message as a template sees it.
type Message struct {
	Role, Content string
}

// TemplateError is a chat template that failed to render a request's
// messages: Raised is the message of the template's raise_exception (the
// template refuses these messages), else Err says what went wrong in it.
type TemplateError struct {
	Source string
	Raised string
	Err    error
}

func (e *TemplateError) Error() string {
	if e.Raised != "" {
		return fmt.Sprintf("the chat template (%s) refused the messages: %s", e.Source, e.Raised)
	}
	return fmt.Sprintf("the chat template (%s) failed to render the messages: %v", e.Source, e.Err)
}

func (e *TemplateError) Unwrap() error { return e.Err }

// Render applies the template to msgs, with add_generation_prompt true
// (the prompt ends where the assistant's answer begins), under the limits
// of MaxTemplateSteps and the constants beside it: a render that passes
// one fails with a *TemplateError whose Err is a *TemplateLimitError.
//
// A panic inside gonja (it panics on some inputs, e.g. an integer modulo
// by zero) is recovered into a *TemplateError too.
func (c *Template) Render(msgs []Message) (_ string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &TemplateError{Source: c.Source, Err: fmt.Errorf("gonja panicked: %v", p)}
		}
	}()
	ms := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		ms[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	var raised string
	b := newBudget()
	ctx := exec.NewContext(map[string]any{
		budgetKey:               b,
		"messages":              ms,
		"add_generation_prompt": true,
		"bos_token":             c.bos,
		"eos_token":             c.eos,
		"raise_exception": func(msg string) (string, error) {
			raised = msg
			return "", errors.New(msg)
		},
	})
	var out strings.Builder
	err = c.tpl.Execute(&limitWriter{w: &out, b: b}, ctx)
	if b.err != nil { // a limit, whatever gonja made of it
		return "", &TemplateError{Source: c.Source, Err: b.err}
	}
	if err != nil {
		return "", &TemplateError{Source: c.Source, Raised: raised, Err: err}
	}
	return out.String(), nil
}

// Load returns the chat template of the Hugging Face checkpoint
// directory dir, or nil when it has none: chat_template.jinja when it
// exists (transformers' own file), else tokenizer_config.json's
// chat_template (a string, or a list of named templates of which
// "default" is taken). bos_token and eos_token come from
// tokenizer_config.json (a string or an added token's {"content": ...}).
// A file that does not read or parse is an error naming it, and so is a
// template that does not render a minimal conversation (Check), so that a
// server refuses it at start rather than on every chat request.
//
// A non-empty file (vLLM's --chat-template) is the template instead, with
// the special tokens of dir's tokenizer_config.json (dir may be "": none).
func Load(dir, file string) (*Template, error) {
	var tc struct {
		Template json.RawMessage `json:"chat_template"`
		BOS      json.RawMessage `json:"bos_token"`
		EOS      json.RawMessage `json:"eos_token"`
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(cfgPath)
	switch {
	case dir == "" || errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(data, &tc); err != nil {
			return nil, fmt.Errorf("%s: %v", cfgPath, err)
		}
	}
	bos, err := specialToken(tc.BOS)
	if err != nil {
		return nil, fmt.Errorf("%s: bos_token: %v", cfgPath, err)
	}
	eos, err := specialToken(tc.EOS)
	if err != nil {
		return nil, fmt.Errorf("%s: eos_token: %v", cfgPath, err)
	}
	if file != "" {
		text, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("chat template: %w", err)
		}
		return checked(Parse(file, string(text), bos, eos))
	}
	if dir == "" {
		return nil, nil
	}
	jinja := filepath.Join(dir, "chat_template.jinja")
	if text, err := os.ReadFile(jinja); err == nil {
		return checked(Parse(jinja, string(text), bos, eos))
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if len(tc.Template) == 0 || string(tc.Template) == "null" {
		return nil, nil
	}
	var text string
	if err := json.Unmarshal(tc.Template, &text); err != nil {
		var named []struct{ Name, Template string }
		if err := json.Unmarshal(tc.Template, &named); err != nil {
			return nil, fmt.Errorf("%s: chat_template: want a string or a list of {\"name\", \"template\"}", cfgPath)
		}
		var names []string
		for _, n := range named {
			if n.Name == "default" {
				text = n.Template
			}
			names = append(names, n.Name)
		}
		if text == "" {
			return nil, fmt.Errorf("%s: chat_template: no template named \"default\" (it has %s)", cfgPath, strings.Join(names, ", "))
		}
	}
	return checked(Parse(cfgPath+"'s chat_template", text, bos, eos))
}

// checked is c, err with c's Check as the error when err is nil.
func checked(c *Template, err error) (*Template, error) {
	if err != nil {
		return nil, err
	}
	if err := c.Check(); err != nil {
		return nil, fmt.Errorf("chat template (%s) does not render a minimal conversation: %w", c.Source, err)
	}
	return c, nil
}

// specialToken reads a tokenizer_config.json token: a string, an added
// token {"content": ...}, or null.
func specialToken(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var at struct{ Content *string }
	if err := json.Unmarshal(raw, &at); err != nil || at.Content == nil {
		return "", fmt.Errorf("want a string or {\"content\": string}, got %s", describe(raw))
	}
	return *at.Content, nil
}

// describe is raw for a message, cut at 40 bytes (core/serve's requests
// quote their fields the same way).
func describe(raw json.RawMessage) string {
	if len(raw) > 40 {
		return string(raw[:40]) + "..."
	}
	return string(raw)
}
