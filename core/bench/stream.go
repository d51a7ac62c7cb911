package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds on what a server may send, checked before anything grows with it.
const (
	// MaxLineBytes bounds one SSE line.
	MaxLineBytes = 1 << 20
	// MaxStreamBytes bounds one response body.
	MaxStreamBytes = 256 << 20
	// maxErrorBody is how much of an error answer's body is read for its
	// message.
	maxErrorBody = 4 << 10
)

// maxEvents bounds the data events of a stream asking for maxTokens tokens:
// a server may send a chunk per token, one for the role, one for the
// finish reason and one for usage, per choice; more is garbage.
func maxEvents(maxTokens int) int { return 2*maxTokens + 16 }

// result is one request's outcome, as the client saw it.
type result struct {
	ok     bool
	kind   string // an error kind (report.BenchErrorKinds) when !ok
	reason string
	status int // the HTTP status; 0 when none came

	sent      time.Time
	ttft, e2e time.Duration
	itl       []float64 // ms, one per token after the first chunk's
	streamed  int       // tokens counted in the stream
	ids       []int32   // the token ids, when every chunk with tokens carried them
	idsAll    bool
	usage     *usage
}

// usage is the OpenAI usage object, the fields kvx bench reads.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usage) cached() int {
	if u == nil || u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

// chunk is one streamed completion chunk, the fields kvx bench reads.
type chunk struct {
	Choices []struct {
		Text     *string `json:"text"`
		TokenIDs []int32 `json:"token_ids"`
		Delta    *struct {
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage          `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// fail sets r's error.
func (r *result) fail(kind, format string, args ...any) *result {
	r.ok, r.kind, r.reason = false, kind, fmt.Sprintf(format, args...)
	return r
}

// stream sends one streamed completion request and reads its answer to the
// end, within ctx. It never panics on what the server sends: every problem
// becomes r's kind and reason.
func (b *runner) stream(ctx context.Context, body []byte, maxTokens int) *result {
	r := &result{idsAll: true}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return r.fail("connect", "building the request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	r.sent = time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		return r.fail(transportKind(ctx, err), "%v", cleanErr(err))
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		msg := errorMessage(resp.Body)
		kind := "http_other"
		switch {
		case resp.StatusCode >= 500:
			kind = "http_5xx"
		case resp.StatusCode >= 400:
			kind = "http_4xx"
		case resp.StatusCode >= 300:
			msg = fmt.Sprintf("a redirect to %q, not followed: kvx bench only sends to --url", resp.Header.Get("Location"))
		}
		return r.fail(kind, "HTTP %d: %s", resp.StatusCode, msg)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream") {
		return r.fail("content_type", "HTTP 200 with Content-Type %q, want text/event-stream", ct)
	}
	return readEvents(ctx, resp.Body, maxTokens, r)
}

// readEvents reads a server-sent event stream of completion chunks into r
// (whose sent time is set) until data: [DONE], within the bounds above.
// Whatever body holds, it returns r with ok set or an error kind.
func readEvents(ctx context.Context, body io.Reader, maxTokens int, r *result) *result {
	br := bufio.NewReaderSize(io.LimitReader(body, MaxStreamBytes+1), 64<<10)
	var read int64
	var data []byte // the data of the event being read
	events, limit := 0, maxEvents(maxTokens)
	prev := time.Time{}
	for {
		line, err := readLine(br, &read)
		if err != nil {
			switch {
			case errors.Is(err, errLineTooLong):
				return r.fail("bad_sse", "a line longer than %d bytes", MaxLineBytes)
			case read > MaxStreamBytes:
				return r.fail("bad_sse", "the stream is longer than %d bytes", MaxStreamBytes)
			case ctx.Err() != nil:
				return r.fail("timeout", "after %d tokens: %v", r.streamed, context.Cause(ctx))
			case errors.Is(err, io.EOF):
				return r.fail("cut", "the stream ended after %d tokens without data: [DONE]", r.streamed)
			}
			return r.fail("cut", "after %d tokens: %v", r.streamed, cleanErr(err))
		}
		if len(line) > 0 {
			switch {
			case line[0] == ':': // a comment (a keep-alive)
			case bytes.HasPrefix(line, []byte("data:")):
				d := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
				if data != nil {
					data = append(data, '\n')
				}
				data = append(data, d...)
			case hasField(line, "event"), hasField(line, "id"), hasField(line, "retry"):
			default:
				return r.fail("bad_sse", "line %q is not a server-sent event field", clip(line))
			}
			continue
		}
		// A blank line ends the event.
		if data == nil {
			continue
		}
		ev := data
		data = nil
		if events++; events > limit {
			return r.fail("bad_sse", "more than %d events for max_tokens %d", limit, maxTokens)
		}
		if string(ev) == "[DONE]" {
			r.ok = true
			r.e2e = time.Since(r.sent)
			if r.streamed == 0 && r.usage == nil {
				return r.fail("cut", "data: [DONE] before any token")
			}
			return r
		}
		var c chunk
		if err := json.Unmarshal(ev, &c); err != nil {
			return r.fail("bad_sse", "event %q is not a JSON chunk: %v", clip(ev), err)
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			return r.fail("stream_error", "error event after %d tokens: %s", r.streamed, clip(c.Error))
		}
		if c.Usage != nil {
			r.usage = c.Usage
		}
		n := 0
		for _, ch := range c.Choices {
			switch {
			case ch.TokenIDs != nil:
				n += len(ch.TokenIDs)
				if r.idsAll {
					r.ids = append(r.ids, ch.TokenIDs...)
				}
			case ch.Text != nil && *ch.Text != "", ch.Delta != nil && ch.Delta.Content != nil && *ch.Delta.Content != "":
				n++
				r.idsAll = false
			}
		}
		if n == 0 {
			continue
		}
		now := time.Now()
		if r.streamed == 0 {
			r.ttft = now.Sub(r.sent)
		} else {
			gap := float64(now.Sub(prev)) / 1e6 / float64(n)
			for range n {
				r.itl = append(r.itl, gap)
			}
		}
		prev = now
		r.streamed += n
	}
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line without its end (\n, \r\n or \r\n), at most
// MaxLineBytes; read counts the bytes read.
func readLine(br *bufio.Reader, read *int64) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		*read += int64(len(frag))
		if len(line)+len(frag) > MaxLineBytes+2 {
			return nil, errLineTooLong
		}
		line = append(line, frag...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return nil, err
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		return bytes.TrimSuffix(line, []byte("\r")), nil
	}
}

func hasField(line []byte, name string) bool {
	return bytes.HasPrefix(line, []byte(name+":")) || string(line) == name
}

// clip is b, shortened and made printable for a message.
func clip(b []byte) string {
	const n = 80
	if len(b) > n {
		b = b[:n]
	}
	s := strings.ToValidUTF8(string(b), "?")
	if len(b) == n {
		s += "..."
	}
	return s
}

// errorMessage is an error answer's message: OpenAI's error.message when
// the body has one, else its first bytes.
func errorMessage(body io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(body, maxErrorBody))
	var v struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Detail any `json:"detail"`
	}
	if json.Unmarshal(b, &v) == nil {
		if v.Error.Message != "" {
			return clip([]byte(v.Error.Message))
		}
		if v.Detail != nil {
			return clip([]byte(fmt.Sprint(v.Detail)))
		}
	}
	if len(b) == 0 || !utf8.Valid(b) {
		return fmt.Sprintf("%d bytes of body", len(b))
	}
	return clip(bytes.TrimSpace(b))
}

// transportKind names a failed round trip: timeout when ctx ended, else
// connect.
func transportKind(ctx context.Context, err error) string {
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "connect"
}

// cleanErr drops net/http's "Post \"url\": " wrapper.
func cleanErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
