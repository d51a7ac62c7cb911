package engine

import "slices"

// tokenLog is a request's tokens: its prompt, the caller's and never
// written, followed by the tokens it generated. The two are kept apart so
// that the first generated token does not copy the prompt (a prompt of a
// million tokens is 4 MB, and a workload holds many): a view across both
// (a recompute's chunk, a penalized sampler's context, a readmission's
// prompt) joins them once, and the joined copy then grows with each token.
type tokenLog struct {
	prompt []int32 // capped at its length: appending never writes the caller's array
	gen    []int32
	joined []int32 // prompt then gen, once a view across both was asked for; nil before
}

func newTokenLog(prompt []int32) tokenLog { return tokenLog{prompt: slices.Clip(prompt)} }

// Len is the number of tokens, prompt and generated.
func (l *tokenLog) Len() int { return len(l.prompt) + len(l.gen) }

// Prompt is the prompt; the slice must not be modified.
func (l *tokenLog) Prompt() []int32 { return l.prompt }

// Generated are the generated tokens; the slice must not be modified.
func (l *tokenLog) Generated() []int32 { return l.gen }

// At is token i.
func (l *tokenLog) At(i int) int32 {
	if i < len(l.prompt) {
		return l.prompt[i]
	}
	return l.gen[i-len(l.prompt)]
}

// Span is tokens [a, b), capped at its length; the slice must not be
// modified. It copies nothing when the span lies in the prompt or in the
// generated tokens; otherwise it joins the two (once for the request).
func (l *tokenLog) Span(a, b int) []int32 {
	p := len(l.prompt)
	switch {
	case b <= p:
		return l.prompt[a:b:b]
	case a >= p:
		return l.gen[a-p : b-p : b-p]
	}
	if l.joined == nil {
		l.joined = slices.Concat(l.prompt, l.gen)
	}
	return l.joined[a:b:b]
}

// All is every token, Span(0, Len()).
func (l *tokenLog) All() []int32 { return l.Span(0, l.Len()) }

// Append adds generated tokens.
func (l *tokenLog) Append(t ...int32) {
	l.gen = append(l.gen, t...)
	if l.joined != nil {
		l.joined = append(l.joined, t...)
	}
}
