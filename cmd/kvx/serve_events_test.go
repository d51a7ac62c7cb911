package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func cachedTokens(t *testing.T, v map[string]any) int {
	t.Helper()
	return num(parseAnswer(t, v, false).usage["prompt_tokens_details"].(map[string]any)["cached_tokens"])
}

// TestServeCacheSaltAndKVEvents: kvx serve with kv_events_config on
// publishes the blocks a request stores to a ZeroMQ subscriber in vLLM's
// format, and cache_salt keeps two salts' prompts apart (cached_tokens);
// bad cache_salt values are 400s naming the field.
func TestServeCacheSaltAndKVEvents(t *testing.T) {
	t.Run("inprocess", func(t *testing.T) { serveSaltEvents(t) })
	// The managers as plugin processes: salt and events cross the wire.
	t.Run("plugin", func(t *testing.T) { serveSaltEvents(t, "isolation=plugin", "plugin_dirs=["+binDir+"]") })
}

func serveSaltEvents(t *testing.T, sets ...string) {
	port := freePort(t)
	base := startServe(t, serveSim, serveOpts{}, append([]string{
		"kv_events_config.enable_kv_cache_events=true", fmt.Sprintf("kv_events_config.endpoint=tcp://*:%d", port),
		"kv_events_config.topic=kvx"}, sets...)...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, "kvx"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", port)); err != nil {
		t.Fatal(err)
	}
	msgs := make(chan zmq4.Msg, 64)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			msgs <- m
		}
	}()
	ids := make([]string, 100) // 3 full blocks of 32 and 4 tokens
	for i := range ids {
		ids[i] = fmt.Sprint(1000 + i*3)
	}
	body := func(salt string) string {
		s := ""
		if salt != "" {
			s = fmt.Sprintf(`,"cache_salt":%q`, salt)
		}
		return fmt.Sprintf(`{"prompt":[%s],"max_tokens":2%s}`, strings.Join(ids, ","), s)
	}
	// The subscription may take a moment: repeat a first request (salt
	// "probe") until a batch arrives.
	var stored [][]any
	for deadline := time.Now().Add(10 * time.Second); len(stored) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no KV event batch reached the subscriber in 10 s")
		}
		if code, v, _ := post(t, base+"/v1/completions", body(fmt.Sprintf("probe-%d", time.Now().UnixNano()))); code != 200 {
			t.Fatalf("%d %v", code, v)
		}
		select {
		case m := <-msgs:
			stored = append(stored, storedOf(t, m)...)
		case <-time.After(300 * time.Millisecond):
		}
	}
	for len(msgs) > 0 {
		<-msgs
	}

	code, v, _ := post(t, base+"/v1/completions", body("tenant-a"))
	if code != 200 || cachedTokens(t, v) != 0 {
		t.Fatalf("first tenant-a request: %d %v, want 200 and nothing cached", code, v)
	}
	// Its 3 full blocks are stored, with their tokens, as one chain.
	var toks []string
	var seqs []uint64
	for deadline := time.After(10 * time.Second); len(toks) < 96; {
		select {
		case m := <-msgs:
			seqs = append(seqs, binary.BigEndian.Uint64(m.Frames[1]))
			for _, ev := range storedOf(t, m) {
				for _, x := range ev[3].([]any) {
					toks = append(toks, fmt.Sprint(x))
				}
				if ev[6] != "GPU" || fmt.Sprint(ev[4]) != "32" {
					t.Errorf("BlockStored %v: want block size 32 on GPU", ev)
				}
			}
		case <-deadline:
			t.Fatalf("tenant-a's blocks not published in 10 s: got %d tokens", len(toks))
		}
	}
	if !slices.Equal(toks, ids[:96]) {
		t.Errorf("stored tokens %v, want the prompt's first 96", toks)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Errorf("sequence numbers %v are not consecutive", seqs)
		}
	}
	for _, tc := range []struct {
		salt   string
		cached bool
	}{{"tenant-a", true}, {"tenant-b", false}, {"", false}} {
		code, v, _ := post(t, base+"/v1/completions", body(tc.salt))
		if code != 200 || (cachedTokens(t, v) > 0) != tc.cached {
			t.Errorf("salt %q: %d, cached_tokens %v; want cached %v", tc.salt, code, v["usage"], tc.cached)
		}
	}
	for _, tc := range []struct{ salt, want string }{
		{`5`, "cache_salt: got JSON number, want a string"},
		{`""`, "cache_salt is empty"},
		{fmt.Sprintf("%q", strings.Repeat("s", 257)), "cache_salt is 257 bytes: the limit is 256"},
	} {
		code, v, _ := post(t, base+"/v1/completions", `{"prompt":[1,2,3],"max_tokens":1,"cache_salt":`+tc.salt+`}`)
		e, _ := v["error"].(map[string]any)
		if code != 400 || e["param"] != "cache_salt" || !strings.Contains(fmt.Sprint(e["message"]), tc.want) {
			t.Errorf("cache_salt %s: %d %v, want 400 naming cache_salt: %q", tc.salt, code, v, tc.want)
		}
	}
}

// storedOf decodes a KV event message and returns its BlockStored events.
func storedOf(t *testing.T, m zmq4.Msg) [][]any {
	t.Helper()
	if len(m.Frames) != 3 || string(m.Frames[0]) != "kvx" || len(m.Frames[1]) != 8 {
		t.Fatalf("KV event message frames %q: want topic, seq, payload", m.Frames)
	}
	var batch []any
	if err := msgpack.Unmarshal(m.Frames[2], &batch); err != nil || len(batch) != 3 {
		t.Fatalf("payload %v (%v): want [ts, events, rank]", batch, err)
	}
	var out [][]any
	for _, e := range batch[1].([]any) {
		if ev := e.([]any); ev[0] == "BlockStored" {
			out = append(out, ev)
		}
	}
	return out
}
