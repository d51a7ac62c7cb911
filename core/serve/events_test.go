package serve

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

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// batch is a decoded KVEventBatch.
type batch struct {
	seq    uint64
	ts     float64
	rank   int64
	events [][]any // each: tag, then the fields in order
}

func asUint(t *testing.T, v any) uint64 {
	t.Helper()
	switch x := v.(type) {
	case uint64:
		return x
	case uint32:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint8:
		return uint64(x)
	case int64:
		return uint64(x)
	case int32:
		return uint64(x)
	case int16:
		return uint64(x)
	case int8:
		return uint64(x)
	}
	t.Fatalf("%#v (%T) is not an integer", v, v)
	return 0
}

func uints(t *testing.T, v any) []uint64 {
	t.Helper()
	list, ok := v.([]any)
	if !ok {
		t.Fatalf("%#v is not a list", v)
	}
	out := make([]uint64, len(list))
	for i, e := range list {
		out[i] = asUint(t, e)
	}
	return out
}

// decodeBatch parses a payload as vLLM's msgspec decoder would read the
// array-like KVEventBatch.
func decodeBatch(t *testing.T, seq uint64, payload []byte) batch {
	t.Helper()
	var raw []any
	if err := msgpack.Unmarshal(payload, &raw); err != nil {
		t.Fatalf("seq %d: payload is not msgpack: %v", seq, err)
	}
	if len(raw) != 3 {
		t.Fatalf("seq %d: batch %#v: want [ts, events, data_parallel_rank]", seq, raw)
	}
	ts, ok := raw[0].(float64)
	evs, ok2 := raw[1].([]any)
	if !ok || !ok2 {
		t.Fatalf("seq %d: batch %#v: want a float ts and a list of events", seq, raw)
	}
	b := batch{seq: seq, ts: ts, rank: int64(asUint(t, raw[2]))}
	for _, e := range evs {
		fields, ok := e.([]any)
		if !ok || len(fields) == 0 {
			t.Fatalf("seq %d: event %#v is not a tagged array", seq, e)
		}
		want := map[string]int{"BlockStored": 8, "BlockRemoved": 3, "AllBlocksCleared": 1}[fmt.Sprint(fields[0])]
		if want == 0 || len(fields) != want {
			t.Fatalf("seq %d: event %#v: unknown tag or %d fields, want %d", seq, fields, len(fields), want)
		}
		b.events = append(b.events, fields)
	}
	return b
}

// recv receives one message within 5 s.
func recv(t *testing.T, s zmq4.Socket) zmq4.Msg {
	t.Helper()
	type res struct {
		m   zmq4.Msg
		err error
	}
	c := make(chan res, 1)
	go func() { m, err := s.Recv(); c <- res{m, err} }()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("Recv: %v", r.err)
		}
		return r.m
	case <-time.After(5 * time.Second):
		t.Fatal("Recv: nothing within 5 s")
	}
	return zmq4.Msg{}
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr[len("tcp://"):])
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return p
}

// script is a manager driven by hand whose events go to a publisher.
type script struct {
	t   *testing.T
	m   *cachemgrv2.Manager
	pub *Publisher
}

func (s *script) flush() {
	evs, err := s.m.Events(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	s.pub.KVEvents(evs)
}

// run prefills prompt as seq (new, no reuse) and publishes the events.
func (s *script) run(seq kvcache.SeqID, salt string, prompt []int32) {
	g, err := s.m.Reserve(context.Background(), []kvcache.ReserveItem{{Seq: seq, New: true, Tokens: len(prompt), Prompt: prompt, CacheSalt: salt}})
	if err != nil || !g[0].OK {
		s.t.Fatalf("Reserve(seq %d): %v %+v", seq, err, g)
	}
	if _, err := s.m.Commit(context.Background(), []kvcache.CommitItem{{Seq: seq, Accepted: len(prompt)}}); err != nil {
		s.t.Fatal(err)
	}
	s.flush()
}

func (s *script) release(seqs ...kvcache.SeqID) {
	if err := s.m.Release(context.Background(), seqs); err != nil {
		s.t.Fatal(err)
	}
	s.flush()
}

func promptOf(n int, seed int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = seed*10007 + int32(i)
	}
	return p
}

// TestPublisherOverZMQ: a ZeroMQ subscriber decodes a scripted run's
// batches in vLLM's format, with consecutive sequence numbers: the prompt's
// blocks stored with the hashes the manager's tree holds, removed when
// evicted; the replay endpoint resends the batches the subscriber missed,
// then the end marker.
func TestPublisherOverZMQ(t *testing.T) {
	pub, err := NewPublisher(EventsOptions{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", BufferSteps: 64, Topic: "kv", DataParallelRank: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	layers := []spec.Layer{{Index: 0, Mixer: spec.MixerGQA, Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 256}}}}
	m := cachemgrv2.New()
	if _, err := m.Configure(context.Background(), kvcache.Config{Stages: 1, Layers: layers, TokensPerBlock: 4,
		DeviceBytes: 12 * 4 * 256, MaxBatchSize: 4, MaxNumTokens: 16, MaxSeqLen: 32, EnableBlockReuse: true, KVEvents: true}); err != nil {
		t.Fatal(err)
	}
	s := &script{t: t, m: m, pub: pub}
	p := promptOf(13, 1)
	s.run(1, "tenant", p) // seq 0: AllBlocksCleared, then p's 3 blocks stored; nobody listens yet
	var want []uint64
	n := m.Tree().Root()
	for i := range 3 {
		n = m.Tree().SaltedChild(n, "tenant", p[4*i:4*i+4])
		want = append(want, n.ChainHash())
	}

	// Batch 0 goes out before anyone subscribes.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		pub.mu.Lock()
		sent := pub.next
		pub.mu.Unlock()
		if sent == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("batch 0 not published after 10 s")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial("tcp://127.0.0.1:" + port(t, pub.Addr())); err != nil {
		t.Fatal(err)
	}
	// A subscription takes effect a moment after the connection: wait
	// until the publisher has it.
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(pub.pub.(zmq4.Topics).Topics(), "kv"); {
		if time.Now().After(deadline) {
			t.Fatal("the publisher has no subscription after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Release p (its blocks stay cached), then fill the cache with two
	// fresh 16-token prompts and a 4-token one: p's blocks are evicted.
	s.release(1)
	s.run(2, "", promptOf(16, 2))
	s.run(3, "", promptOf(16, 3))
	s.run(4, "", promptOf(16, 4))
	var got []batch
	removed := map[uint64]bool{}
	for len(removed) < 3 {
		msg := recv(t, sub)
		if len(msg.Frames) != 3 || string(msg.Frames[0]) != "kv" || len(msg.Frames[1]) != 8 {
			t.Fatalf("message frames %q: want topic, 8-byte seq, payload", msg.Frames)
		}
		b := decodeBatch(t, binary.BigEndian.Uint64(msg.Frames[1]), msg.Frames[2])
		if len(got) > 0 && b.seq != got[len(got)-1].seq+1 || len(got) == 0 && b.seq > 1 {
			// Batch 0 was numbered before the subscription; its send may
			// still have raced it, so the first heard is 1, or 0.
			t.Fatalf("seq %d after %d batches heard: want 1 (or 0) first, then consecutive", b.seq, len(got))
		}
		if time.Since(time.Unix(0, int64(b.ts*1e9))) > time.Minute || b.rank != 0 {
			t.Fatalf("batch ts %v, rank %d: want now and 0", b.ts, b.rank)
		}
		for _, e := range b.events {
			if e[0] == "BlockRemoved" {
				if e[2] != "GPU" {
					t.Errorf("BlockRemoved medium %v, want GPU", e[2])
				}
				for _, h := range uints(t, e[1]) {
					if slices.Contains(want, h) {
						removed[h] = true
					}
				}
			}
		}
		got = append(got, b)
	}

	// The replay returns the batches from 0: the missed first batch, with
	// p's blocks stored, then the rest, then the end marker.
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial("tcp://127.0.0.1:" + port(t, pub.ReplayAddr())); err != nil {
		t.Fatal(err)
	}
	if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, make([]byte, 8))); err != nil {
		t.Fatal(err)
	}
	var replayed []batch
	for {
		msg := recv(t, dealer)
		f := msg.Frames
		if len(f) != 3 || len(f[0]) != 0 || len(f[1]) != 8 {
			t.Fatalf("replay frames %q: want empty delimiter, seq, payload", f)
		}
		if int64(binary.BigEndian.Uint64(f[1])) == -1 {
			if len(f[2]) != 0 {
				t.Fatalf("end marker with payload %q", f[2])
			}
			break
		}
		replayed = append(replayed, decodeBatch(t, binary.BigEndian.Uint64(f[1]), f[2]))
	}
	last := got[len(got)-1].seq
	if len(replayed) < int(last)+1 {
		t.Fatalf("replay returned %d batches, want at least seqs 0..%d", len(replayed), last)
	}
	for i, b := range replayed {
		if b.seq != uint64(i) {
			t.Fatalf("replayed batch %d has seq %d", i, b.seq)
		}
	}
	b0 := replayed[0]
	if len(b0.events) != 2 || b0.events[0][0] != "AllBlocksCleared" || b0.events[1][0] != "BlockStored" {
		t.Fatalf("missed batch 0 = %#v: want AllBlocksCleared then BlockStored", b0.events)
	}
	st := b0.events[1] // tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name
	toks := uints(t, st[3])
	wantToks := make([]uint64, 12)
	for i := range wantToks {
		wantToks[i] = uint64(p[i])
	}
	if !slices.Equal(uints(t, st[1]), want) || st[2] != nil || !slices.Equal(toks, wantToks) ||
		asUint(t, st[4]) != 4 || st[5] != nil || st[6] != "GPU" || st[7] != nil {
		t.Fatalf("BlockStored %#v: want hashes %v, no parent, p's 12 tokens, block size 4, GPU", st, want)
	}
	// What the subscriber heard is what the replay holds, byte for byte decoded.
	for _, b := range got {
		if r := replayed[b.seq]; !slices.EqualFunc(r.events, b.events, func(x, y []any) bool { return fmt.Sprint(x) == fmt.Sprint(y) }) {
			t.Fatalf("seq %d: published %v, replayed %v", b.seq, b.events, r.events)
		}
	}
}

// TestPublisherBufferBounded: the replay buffer keeps the last
// buffer_steps batches only, and a replay from before them starts at the
// oldest kept.
func TestPublisherBufferBounded(t *testing.T) {
	pub, err := NewPublisher(EventsOptions{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", BufferSteps: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for range 5 {
		pub.KVEvents([]kvcache.Event{{Kind: kvcache.BlockRemoved, Hashes: []uint64{7}, Tier: kvcache.TierHost}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial("tcp://127.0.0.1:" + port(t, pub.ReplayAddr())); err != nil {
		t.Fatal(err)
	}
	// The 5 batches are published asynchronously: ask until all are in.
	for deadline := time.Now().Add(5 * time.Second); ; {
		if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, make([]byte, 8))); err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for {
			f := recv(t, dealer).Frames
			s := binary.BigEndian.Uint64(f[1])
			if int64(s) == -1 {
				break
			}
			b := decodeBatch(t, s, f[2])
			if b.events[0][0] != "BlockRemoved" || b.events[0][2] != "CPU" {
				t.Fatalf("batch %v: want BlockRemoved on CPU", b.events)
			}
			seqs = append(seqs, s)
		}
		if slices.Equal(seqs, []uint64{2, 3, 4}) {
			return
		}
		if time.Now().After(deadline) || len(seqs) > 3 {
			t.Fatalf("replay from 0 = seqs %v, want [2 3 4]", seqs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPublisherBadEndpoint(t *testing.T) {
	if _, err := NewPublisher(EventsOptions{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://256.1.1.1:5", BufferSteps: 1}); err == nil ||
		!strings.Contains(err.Error(), "kv_events_config.replay_endpoint") {
		t.Fatalf("NewPublisher(bad replay endpoint) = %v, want an error naming the key", err)
	}
}
