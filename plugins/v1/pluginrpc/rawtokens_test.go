package pluginrpc

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestRawTokens: a prompt sent as raw tokens (FeatureRawTokens) reads back
// as the same tokens as the packed form, negative and large ids included,
// costs 4 bytes a token on the wire, and does not alias the message; a
// malformed raw field or a message with both forms is refused, naming the
// field.
func TestRawTokens(t *testing.T) {
	prompt := make([]int32, 1<<16)
	for i := range prompt {
		prompt[i] = int32(i*7919) - 1<<20
	}
	prompt[0], prompt[1] = -1, 1<<31-1
	items := []kvcache.LookupItem{{Seq: 1, Prompt: prompt}, {Seq: 2}, {Seq: 3, Prompt: prompt[:3]}}
	raw, packed := wire(t, toProtoLookupRequest(items, false, true)), wire(t, toProtoLookupRequest(items, false, false))
	if len(raw.GetItems()[0].GetPrompt()) != 0 || len(packed.GetItems()[0].GetPromptRaw()) != 0 {
		t.Fatal("a form set the other's field")
	}
	if n, want := len(raw.GetItems()[0].GetPromptRaw()), 4*len(prompt); n != want {
		t.Errorf("raw prompt of %d tokens: %d bytes, want %d", len(prompt), n, want)
	}
	if r, p := proto.Size(raw), proto.Size(packed); r >= p {
		t.Errorf("raw message %d bytes, packed %d: want raw smaller for ids this large", r, p)
	}
	for name, m := range map[string]*kvxpb.LookupRequest{"raw": raw, "packed": packed} {
		got, err := fromProtoLookupRequest(m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i := range items {
			if got[i].Seq != items[i].Seq || !slices.Equal(got[i].Prompt, items[i].Prompt) || (items[i].Prompt == nil) != (got[i].Prompt == nil) {
				t.Errorf("%s: item %d: seq %d, %d tokens, want seq %d, %d tokens", name, i, got[i].Seq, len(got[i].Prompt), items[i].Seq, len(items[i].Prompt))
			}
		}
	}
	got, _ := fromProtoLookupRequest(raw)
	raw.GetItems()[0].GetPromptRaw()[0] = 9
	if got[0].Prompt[0] != -1 {
		t.Error("the decoded prompt aliases the message's bytes")
	}

	reserve := []kvcache.ReserveItem{{Seq: 1, Tokens: 5, New: true, Prompt: prompt[:5]}, {Seq: 2, Tokens: 1}, {Seq: 3, Tokens: 2, New: true, Prompt: prompt[5:9]}}
	back, err := fromProtoReserveRequest(wire(t, toProtoReserveRequest(reserve, true)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range reserve {
		if !slices.Equal(back[i].Prompt, reserve[i].Prompt) {
			t.Errorf("reserve item %d: prompt %v, want %v", i, back[i].Prompt, reserve[i].Prompt)
		}
	}

	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"lookup raw of 5 bytes", func() error {
			_, err := fromProtoLookupRequest(&kvxpb.LookupRequest{Items: []*kvxpb.LookupItem{{Seq: 1}, {Seq: 2, PromptRaw: make([]byte, 5)}}})
			return err
		}, "LookupRequest: items[1]: prompt_raw has 5 bytes, want a multiple of 4"},
		{"lookup with both", func() error {
			_, err := fromProtoLookupRequest(&kvxpb.LookupRequest{Items: []*kvxpb.LookupItem{{Seq: 1, Prompt: []int32{1}, PromptRaw: make([]byte, 4)}}})
			return err
		}, "both prompt (1 tokens) and prompt_raw (4 bytes) are set"},
		{"reserve raw of 6 bytes", func() error {
			_, err := fromProtoReserveRequest(&kvxpb.ReserveRequest{Seq: []uint64{1}, PromptLen: []int64{1}, PromptRaw: make([]byte, 6)})
			return err
		}, "ReserveRequest: prompt_raw has 6 bytes"},
		{"reserve raw shorter than its lengths", func() error {
			_, err := fromProtoReserveRequest(&kvxpb.ReserveRequest{Seq: []uint64{1}, PromptLen: []int64{2}, PromptRaw: make([]byte, 4)})
			return err
		}, "prompt_len[0] = 2, want 0..1"},
	} {
		if err := tc.err(); err == nil || !strings.Contains(err.Error(), tc.want) || kvcache.KindOf(err) != kvcache.KindInvalidArg {
			t.Errorf("%s: %v, want an invalid-argument error containing %q", tc.name, err, tc.want)
		}
	}
}

// BenchmarkPromptWire: a Lookup of four 256k-token prompts (a long-context
// admission round) marshalled and unmarshalled, packed varints against raw
// tokens.
func BenchmarkPromptWire(b *testing.B) {
	prompt := make([]int32, 256<<10)
	for i := range prompt {
		prompt[i] = int32(i*7919) % 150000
	}
	items := []kvcache.LookupItem{{Seq: 1, Prompt: prompt}, {Seq: 2, Prompt: prompt}, {Seq: 3, Prompt: prompt}, {Seq: 4, Prompt: prompt}}
	for _, raw := range []bool{false, true} {
		name := "packed"
		if raw {
			name = "raw"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				buf, err := proto.Marshal(toProtoLookupRequest(items, true, raw))
				if err != nil {
					b.Fatal(err)
				}
				var m kvxpb.LookupRequest
				if err := proto.Unmarshal(buf, &m); err != nil {
					b.Fatal(err)
				}
				if _, err := fromProtoLookupRequest(&m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
