package serve

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The event sockets' peers are outside kvx: a subscriber on the PUB
// endpoint, any client of the replay endpoint. zmq4 (v0.17) reads a ZMTP
// frame by allocating the size its header claims, up to 2^63-1 bytes,
// before a byte of it has come, on the goroutine that accepted the
// connection: a 73-byte greeting and header that claim 2^62 bytes panic
// the process (makeslice), smaller claims take that much memory. So the
// sockets use zmq4 transports of their own, kvx-tcp and kvx-ipc, which
// are tcp and ipc with every connection's reads checked by a zmtpGuard.

// MaxZMTPFrameBytes bounds one ZMTP frame a peer of the event sockets may
// send. Theirs are small: the greeting's READY command, subscriptions,
// replay requests (an identity, an empty delimiter, 8 bytes).
const MaxZMTPFrameBytes = 1 << 20

const (
	zmtpGreetingBytes = 64 // ZMTP 3: signature, version, mechanism, as-server, filler
	zmtpLong          = 0x2
)

func init() {
	for name, network := range map[string]string{"kvx-tcp": "tcp", "kvx-ipc": "unix"} {
		if err := zmq4.RegisterTransport(name, guardedTransport{transport.New(network)}); err != nil {
			panic(err)
		}
	}
}

// guarded returns the endpoint ep on the guarded transport of its own:
// tcp:// and ipc:// become kvx-tcp:// and kvx-ipc://; others are
// unchanged.
func guarded(ep string) string {
	for _, s := range []string{"tcp", "ipc"} {
		if rest, ok := strings.CutPrefix(ep, s+"://"); ok {
			return "kvx-" + s + "://" + rest
		}
	}
	return ep
}

// guardedTransport is a zmq4 net transport whose connections, accepted or
// dialed, are guardedConns.
type guardedTransport struct{ transport.Transport }

func (t guardedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return &guardedConn{Conn: c}, nil
}

func (t guardedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.Transport.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return guardedListener{l}, nil
}

type guardedListener struct{ net.Listener }

func (l guardedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardedConn{Conn: c}, nil
}

// guardedConn is a connection whose reads pass through a zmtpGuard: a
// frame over MaxZMTPFrameBytes closes it before zmq4 reads the header.
type guardedConn struct {
	net.Conn
	g zmtpGuard
}

func (c *guardedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if gerr := c.g.scan(b[:n]); gerr != nil {
		_ = c.Conn.Close()
		return 0, gerr
	}
	return n, err
}

// zmtpGuard follows a ZMTP 3 byte stream, the greeting and then frames
// (a flags byte, a 1-byte size or with the long flag an 8-byte big-endian
// one, the body), and refuses a frame whose size is over
// MaxZMTPFrameBytes. It keeps no bytes: its state is where it is in the
// stream, so a stream cut anywhere scans the same.
type zmtpGuard struct {
	greeting int     // greeting bytes seen
	hdr      [9]byte // the current frame header's bytes so far
	nh       int
	body     uint64 // body bytes of the current frame still to come
}

// scan advances the guard over b, the next bytes of the stream. After an
// error the guard's state is undefined.
func (g *zmtpGuard) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case g.greeting < zmtpGreetingBytes:
			k := min(len(b), zmtpGreetingBytes-g.greeting)
			g.greeting += k
			b = b[k:]
		case g.body > 0:
			k := min(uint64(len(b)), g.body)
			g.body -= k
			b = b[k:]
		default:
			g.hdr[g.nh] = b[0]
			g.nh++
			b = b[1:]
			need := 2
			if g.hdr[0]&zmtpLong != 0 {
				need = 9
			}
			if g.nh < need {
				continue
			}
			size := uint64(g.hdr[1])
			if need == 9 {
				size = binary.BigEndian.Uint64(g.hdr[1:9])
			}
			g.nh = 0
			if size > MaxZMTPFrameBytes {
				return fmt.Errorf("kv events: a peer sent a ZMTP frame of %d bytes, over the limit of %d", size, MaxZMTPFrameBytes)
			}
			g.body = size
		}
	}
	return nil
}
