package serve

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"
)

// zmtpBytes is a ZMTP 3 greeting (NULL mechanism) followed by frames.
func zmtpBytes(frames ...[]byte) []byte {
	g := make([]byte, zmtpGreetingBytes)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	for _, f := range frames {
		g = append(g, f...)
	}
	return g
}

// shortFrame and longFrame are ZMTP frames with the given flags and body.
func shortFrame(flags byte, body []byte) []byte {
	return append([]byte{flags, byte(len(body))}, body...)
}

func longHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | zmtpLong}, size)
}

// refScan is the guard's rule over a whole stream, written plainly: walk
// the frames after the greeting and say whether a header claims more than
// MaxZMTPFrameBytes.
func refScan(b []byte) (refused bool) {
	if len(b) <= zmtpGreetingBytes {
		return false
	}
	b = b[zmtpGreetingBytes:]
	for len(b) > 0 {
		var size uint64
		if b[0]&zmtpLong != 0 {
			if len(b) < 9 {
				return false
			}
			size, b = binary.BigEndian.Uint64(b[1:9]), b[9:]
		} else {
			if len(b) < 2 {
				return false
			}
			size, b = uint64(b[1]), b[2:]
		}
		if size > MaxZMTPFrameBytes {
			return true
		}
		b = b[min(uint64(len(b)), size):]
	}
	return false
}

// FuzzZMTPGuard scans the input as a ZMTP stream from a peer of the event
// sockets. Properties: no panic; a stream is refused exactly when a frame
// header in it claims more than MaxZMTPFrameBytes (refScan); the verdict
// does not depend on how the stream is cut into reads.
func FuzzZMTPGuard(f *testing.F) {
	req := zmtpBytes(shortFrame(0x4, append([]byte{5}, "READY"...)), shortFrame(0x1, []byte("id")), shortFrame(0x1, nil),
		shortFrame(0, make([]byte, 8)))
	f.Add(req, uint16(70))
	f.Add(zmtpBytes(longHeader(0x4, 1<<62)), uint16(65))
	f.Add(zmtpBytes(longHeader(0, MaxZMTPFrameBytes), make([]byte, 100)), uint16(3))
	f.Add(zmtpBytes(longHeader(0, MaxZMTPFrameBytes+1)), uint16(72))
	f.Add(zmtpBytes(shortFrame(0, make([]byte, 255))), uint16(0))
	f.Add([]byte{0xff}, uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		var whole zmtpGuard
		got := whole.scan(data) != nil
		if want := refScan(data); got != want {
			t.Fatalf("scan refused = %v, the rule says %v", got, want)
		}
		k := 0
		if len(data) > 0 {
			k = int(cut) % (len(data) + 1)
		}
		var parts zmtpGuard
		split := parts.scan(data[:k]) != nil || parts.scan(data[k:]) != nil
		if split != got {
			t.Fatalf("scan cut at %d refused = %v, whole %v", k, split, got)
		}
	})
}

// FuzzReplayRequest reads the input as the frames of a replay request
// (each a length byte and that many bytes) and answers it from a ring of
// 5 batches whose first is the input's sequence number. Properties: no
// panic; a request is read exactly when it has two frames or more and a
// last frame of 8 bytes, and then start is that frame, big endian, and
// the envelope the frames before it; the answer is the ring's batches from
// start on, consecutive and in order.
func FuzzReplayRequest(f *testing.F) {
	f.Add([]byte("\x02id\x00\x08\x00\x00\x00\x00\x00\x00\x00\x03"), uint64(0))
	f.Add([]byte("\x08\x00\x00\x00\x00\x00\x00\x00\x03"), uint64(0)) // one frame: not a request
	f.Add([]byte("\x02id\x08\xff\xff\xff\xff\xff\xff\xff\xff"), uint64(1<<64-3))
	f.Add([]byte("\x02id\x07\x00\x00\x00\x00\x00\x00\x00"), uint64(9))
	f.Add([]byte("\x05"), uint64(0)) // cut short
	f.Fuzz(func(t *testing.T, data []byte, first uint64) {
		var frames [][]byte
		for len(data) > 0 {
			n := min(int(data[0]), len(data)-1)
			frames, data = append(frames, data[1:1+n]), data[1+n:]
		}
		envelope, start, ok := replayRequest(frames)
		wantOK := len(frames) >= 2 && len(frames[len(frames)-1]) == 8
		if ok != wantOK {
			t.Fatalf("replayRequest(%d frames) ok = %v, want %v", len(frames), ok, wantOK)
		}
		if !ok {
			return
		}
		if want := binary.BigEndian.Uint64(frames[len(frames)-1]); start != want || len(envelope) != len(frames)-1 {
			t.Fatalf("replayRequest = %d envelope frames, start %d; want %d, %d", len(envelope), start, len(frames)-1, want)
		}
		ring := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d"), []byte("e")}
		first = min(first, math.MaxUint64-uint64(len(ring))) // the next sequence number is a uint64 too
		seqs, bufs := replayFrom(first, ring, start)
		if len(seqs) != len(bufs) {
			t.Fatalf("replayFrom: %d seqs, %d payloads", len(seqs), len(bufs))
		}
		for i, s := range seqs {
			j := s - first // the ring index of s
			if s < start || j >= uint64(len(ring)) || !bytes.Equal(bufs[i], ring[j]) || (i > 0 && s != seqs[i-1]+1) {
				t.Fatalf("replayFrom(%d, 5 batches, %d) = %v: batch %d wrong", first, start, seqs, i)
			}
		}
		if len(seqs) > 0 && seqs[len(seqs)-1] != first+uint64(len(ring))-1 {
			t.Fatalf("replayFrom(%d, 5 batches, %d) = %v: want through the last batch", first, start, seqs)
		}
	})
}

// TestReplayRefusesLongFrame: a client of the replay endpoint whose first
// frame claims 2^62 bytes made zmq4 allocate them (a makeslice panic that
// ended the process). Found writing FuzzReplayRequest. The guard now closes
// that connection and the publisher goes on serving.
func TestReplayRefusesLongFrame(t *testing.T) {
	pub, err := NewPublisher(EventsOptions{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", BufferSteps: 4, Topic: "kv"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, ep := range []string{pub.ReplayAddr(), pub.Addr()} {
		c, err := net.Dial("tcp", strings.TrimPrefix(ep, "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(zmtpBytes(longHeader(0x4, 1<<62))); err != nil {
			t.Fatal(err)
		}
		// The socket sends its greeting, then closes on the frame.
		if _, err := io.ReadAll(c); err != nil {
			t.Errorf("%s: reading until the server closes: %v", ep, err)
		}
		_ = c.Close()
	}
}
