package serve

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// This file is the KV event publisher (kv_events_config): the cache
// managers' BlockStored, BlockRemoved and AllBlocksCleared events in vLLM's
// wire format, so that a KV-aware router (llm-d, Dynamo) can index kvx's
// cache as it indexes vLLM's.
//
// Wire format (vLLM's vllm/distributed/kv_events.py):
//   - every batch is one ZeroMQ multipart message on a PUB socket:
//     topic, the batch's sequence number (8 bytes, big endian, from 0 and
//     consecutive), and the payload;
//   - the payload is msgpack of KVEventBatch as an array,
//     [ts (float seconds), [event, ...], data_parallel_rank], each event a
//     tagged array: ["BlockStored", block_hashes, parent_block_hash or nil,
//     token_ids, block_size, lora_id (nil), medium, lora_name (nil)],
//     ["BlockRemoved", block_hashes, medium] or ["AllBlocksCleared"];
//     medium is "GPU" (kvx's device tier) or "CPU" (its host tier);
//   - a ROUTER socket at the replay endpoint answers a request whose last
//     frame is a start sequence number (8 bytes, big endian) with every
//     buffered batch from it on, each as (seq, payload) after the client's
//     envelope, then (-1 as 8 bytes, empty): the end marker. The buffer keeps
//     the last buffer_steps batches.

// EventsOptions configure a Publisher.
type EventsOptions struct {
	// Endpoint is the PUB socket: bound when its host is * (or it is
	// ipc://), connected otherwise (vLLM's rule).
	Endpoint string
	// ReplayEndpoint is the ROUTER socket for replays (always bound); ""
	// for none.
	ReplayEndpoint string
	BufferSteps    int    // batches kept for replay (at least 1)
	Topic          string // first frame of every message
	// DataParallelRank is the batches' data_parallel_rank.
	DataParallelRank int
	// MaxQueue is how many batches may wait for the publisher goroutine;
	// beyond it new batches are dropped (and counted) rather than block the
	// engine loop. 0 means 100000 (vLLM's max_queue_size).
	MaxQueue int
}

// Publisher publishes KV event batches; it is an engine.EventSink. Its
// methods are safe for concurrent use.
type Publisher struct {
	opt    EventsOptions
	pub    zmq4.Socket
	replay zmq4.Socket // nil without a replay endpoint
	queue  chan []kvcache.Event
	done   chan struct{}
	cancel context.CancelFunc

	mu      sync.Mutex
	next    uint64   // sequence number of the next batch
	ring    [][]byte // payloads of seqs next-len(ring) .. next-1
	dropped int64
	closed  bool
}

var _ engine.EventSink = (*Publisher)(nil)

// endSeq is the replay's end marker: -1 as a signed 8-byte big-endian integer.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// NewPublisher opens the sockets and starts publishing. It fails naming the
// endpoint when a socket cannot be bound or connected.
func NewPublisher(opt EventsOptions) (*Publisher, error) {
	if opt.BufferSteps < 1 {
		return nil, fmt.Errorf("kv_events_config.buffer_steps = %d: must be >= 1", opt.BufferSteps)
	}
	if opt.MaxQueue <= 0 {
		opt.MaxQueue = 100000
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{opt: opt, queue: make(chan []kvcache.Event, opt.MaxQueue), done: make(chan struct{}), cancel: cancel}
	p.pub = zmq4.NewPub(ctx)
	var err error
	if binds(opt.Endpoint) {
		err = p.pub.Listen(guarded(opt.Endpoint))
	} else {
		err = p.pub.Dial(guarded(opt.Endpoint))
	}
	if err != nil {
		p.pub.Close()
		cancel()
		return nil, fmt.Errorf("kv_events_config.endpoint %q: %w", opt.Endpoint, err)
	}
	if opt.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx)
		if err := p.replay.Listen(guarded(opt.ReplayEndpoint)); err != nil {
			p.pub.Close()
			p.replay.Close()
			cancel()
			return nil, fmt.Errorf("kv_events_config.replay_endpoint %q: %w", opt.ReplayEndpoint, err)
		}
		go p.serveReplay()
	}
	go p.run()
	return p, nil
}

// binds applies vLLM's rule: bind a wildcard host or a local transport,
// connect to anything else.
func binds(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// Addr is the address the PUB socket is bound to (nil when it connected).
func (p *Publisher) Addr() string { return addrOf(p.pub) }

// ReplayAddr is the address the replay socket is bound to ("" without one).
func (p *Publisher) ReplayAddr() string {
	if p.replay == nil {
		return ""
	}
	return addrOf(p.replay)
}

func addrOf(s zmq4.Socket) string {
	if a := s.Addr(); a != nil {
		return a.Network() + "://" + a.String()
	}
	return ""
}

// KVEvents implements engine.EventSink: it queues evs as one batch and
// returns at once. A batch that does not fit the queue is dropped and
// counted (Dropped).
func (p *Publisher) KVEvents(evs []kvcache.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(evs) == 0 {
		return
	}
	select {
	case p.queue <- evs:
	default:
		p.dropped++
	}
}

// Dropped is the number of batches dropped because the queue was full.
func (p *Publisher) Dropped() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// Close publishes what is queued, then closes the sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.queue)
	p.mu.Unlock()
	<-p.done
	p.cancel()
	err := p.pub.Close()
	if p.replay != nil {
		err = errors.Join(err, p.replay.Close())
	}
	return err
}

// run publishes queued batches in order, numbering them.
func (p *Publisher) run() {
	defer close(p.done)
	for evs := range p.queue {
		payload, err := EncodeBatch(float64(time.Now().UnixNano())/1e9, evs, p.opt.DataParallelRank)
		if err != nil {
			continue // only values kvx made; cannot happen
		}
		p.mu.Lock()
		seq := p.next
		p.next++
		p.ring = append(p.ring, payload)
		if len(p.ring) > p.opt.BufferSteps {
			p.ring = p.ring[len(p.ring)-p.opt.BufferSteps:]
		}
		p.mu.Unlock()
		var sb [8]byte
		binary.BigEndian.PutUint64(sb[:], seq)
		// A PUB socket drops messages for absent subscribers; a send
		// error means the socket is closing, and the batch stays in the
		// replay buffer.
		_ = p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.opt.Topic), sb[:], payload))
	}
}

// serveReplay answers replay requests until the socket closes.
func (p *Publisher) serveReplay() {
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			return
		}
		envelope, start, ok := replayRequest(msg.Frames)
		if !ok {
			continue
		}
		p.mu.Lock()
		seqs, bufs := replayFrom(p.next-uint64(len(p.ring)), p.ring, start)
		p.mu.Unlock()
		send := func(seq, payload []byte) error {
			frames := append(append([][]byte{}, envelope...), seq, payload)
			return p.replay.SendMulti(zmq4.NewMsgFrom(frames...))
		}
		for i, s := range seqs {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], s)
			if send(sb[:], bufs[i]) != nil {
				return
			}
		}
		if send(endSeq, nil) != nil {
			return
		}
	}
}

// replayRequest reads the frames of a replay request: the client's
// envelope (its identity, and the empty delimiter a REQ client adds), then
// the start sequence number, 8 bytes big endian, as the last frame. ok is
// false for anything else (fewer than two frames, a last frame of another
// length), which is not answered. envelope aliases frames.
func replayRequest(frames [][]byte) (envelope [][]byte, start uint64, ok bool) {
	if len(frames) < 2 || len(frames[len(frames)-1]) != 8 {
		return nil, 0, false
	}
	return frames[:len(frames)-1], binary.BigEndian.Uint64(frames[len(frames)-1]), true
}

// replayFrom returns the batches of ring, whose first is sequence number
// first, from sequence number start on: their numbers and payloads, in
// order (none when start is past the last).
func replayFrom(first uint64, ring [][]byte, start uint64) (seqs []uint64, bufs [][]byte) {
	for i, b := range ring {
		if s := first + uint64(i); s >= start {
			seqs, bufs = append(seqs, s), append(bufs, b)
		}
	}
	return seqs, bufs
}

// EncodeBatch is the msgpack payload of one KVEventBatch (see the file
// comment): array-like, tagged events, hashes as unsigned integers.
func EncodeBatch(ts float64, evs []kvcache.Event, dpRank int) ([]byte, error) {
	out := make([]any, 0, len(evs))
	for _, e := range evs {
		switch e.Kind {
		case kvcache.BlockStored:
			var parent any
			if e.HasParent {
				parent = e.Parent
			}
			out = append(out, []any{"BlockStored", hashes(e.Hashes), parent, tokens(e.Tokens), e.BlockSize, nil, medium(e.Tier), nil})
		case kvcache.BlockRemoved:
			out = append(out, []any{"BlockRemoved", hashes(e.Hashes), medium(e.Tier)})
		case kvcache.AllBlocksCleared:
			out = append(out, []any{"AllBlocksCleared"})
		default:
			return nil, fmt.Errorf("KV event of unknown kind %d", e.Kind)
		}
	}
	return msgpack.Marshal([]any{ts, out, dpRank})
}

func hashes(h []uint64) []uint64 {
	if h == nil {
		return []uint64{}
	}
	return h
}

func tokens(t []int32) []int32 {
	if t == nil {
		return []int32{}
	}
	return t
}

// medium is vLLM's name of a tier.
func medium(t kvcache.Tier) string {
	if t == kvcache.TierHost {
		return "CPU"
	}
	return "GPU"
}
