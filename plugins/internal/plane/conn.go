package plane

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"syscall"
	"time"
)

// planeConn is one end of a data plane: buffered reads of whole frames and
// whole-frame writes, done as raw reads and writes on the socket inside the
// net package's fd guards (RawConn), so a Close waits for them and an fd is
// never used after it closed.
//
// Why not net.Conn's own Read: every wait for a frame through the Go
// netpoller costs several system calls and thread wake-ups (epoll, the
// runtime's sysmon thread woken on each call), and a plugin waits for a
// frame on every call of every step. On a virtual machine that makes each
// kernel entry and each thread switch expensive, those wake-ups were most
// of a manager plugin's time in a sim replay. So a waiting plugin first
// sleeps in one poll system call on the socket, for up to idleWait
// (readSoon), and only then parks in the netpoller like any goroutine.
// Other goroutines of the process wait for the thread meanwhile, so
// idleWait is short.
type planeConn struct {
	c     *net.UnixConn
	rc    syscall.RawConn
	in    []byte // in[r:w] is read and not yet consumed
	r, w  int
	aside []byte // read by the watcher of a running call (readAside)
	// spin, when positive, makes a wait poll the socket without sleeping
	// for up to spin (yielding to other goroutines between polls) instead
	// of sleeping in ppoll: the host's end spins for replies.
	spin time.Duration
	// shm, on a plane of version 3 (Linux), carries the frames instead of the
	// socket (see shmLink); the socket then carries only doorbells and
	// tells of a hang-up.
	shm *shmLink
}

// replySpin is how long the host polls for a reply before it sleeps. A
// reply comes within tens of microseconds in a sim replay; waking a
// sleeping process costs about as much again on a virtual machine, so the
// host keeps its core. Longer calls (a cpu forward) sleep after it.
const replySpin = 200 * time.Microsecond

// shmReplySpin is replySpin on a shared-memory plane, where polling costs
// no system call. Shorter than on the socket: while the host polls, the
// manager and the worker share the other core (the next step's manager
// phase runs beside the forward), so a long poll takes a core they need.
// Whole seed A replays on a 2-core VM, one each: 200 µs 62.0 s, 50 µs
// 58.6 s, 100 µs 57.9 s (the VM's own noise is about ±15%).
const shmReplySpin = 100 * time.Microsecond

// serveSpin is how long a plugin polls a shared-memory plane for the next
// frame before it sleeps: not at all. Its next frame comes a step later,
// and a polling plugin takes the core the other plugin and the host need
// (20 µs made seed A's 16-request slice 30-40% slower than 0: median
// 6.29 s against 4.52-4.79 s, runs interleaved).
const serveSpin = time.Duration(0)

// idleWait bounds how long a data plane end holds its thread in a poll
// before it parks in the netpoller.
const idleWait = time.Millisecond

func newPlaneConn(c *net.UnixConn) (*planeConn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &planeConn{c: c, rc: rc, in: make([]byte, 64<<10)}, nil
}

// fill reads at least one more byte into the buffer.
func (p *planeConn) fill() error {
	if p.r == p.w {
		p.r, p.w = 0, 0
	}
	if p.w == len(p.in) {
		if p.r > 0 {
			p.w = copy(p.in, p.in[p.r:p.w])
			p.r = 0
		} else {
			p.in = append(p.in, make([]byte, len(p.in))...)
		}
	}
	if p.shm != nil {
		n, err := p.shm.read(p.in[p.w:])
		p.w += n
		return err
	}
	var n int
	var rerr error
	var until time.Time
	err := p.rc.Read(func(fd uintptr) bool {
		if p.spin <= 0 {
			n, rerr = readSoon(fd, p.in[p.w:])
			return rerr != syscall.EAGAIN
		}
		for {
			n, rerr = readNow(fd, p.in[p.w:])
			if rerr != syscall.EAGAIN {
				return true
			}
			now := time.Now()
			if until.IsZero() {
				until = now.Add(p.spin)
			} else if now.After(until) {
				return false
			}
			runtime.Gosched()
		}
	})
	if err := readOutcome(err, rerr, n); err != nil {
		return err
	}
	p.w += n
	return nil
}

// readOutcome is a raw read's result: the fd's error (closed, deadline),
// the read's own, or io.EOF when the peer closed its end.
func readOutcome(err, rerr error, n int) error {
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return rerr
	case n == 0:
		return io.EOF
	}
	return nil
}

// buffered returns how many bytes are read and not yet consumed.
// On shared memory that counts what the ring holds.
func (p *planeConn) buffered() int {
	if p.shm != nil {
		return p.w - p.r + p.shm.available()
	}
	return p.w - p.r
}

// next returns the next n bytes, valid until the following call. The
// buffer grows as the bytes arrive (fill doubles it when full), never to n
// at once: a frame's length field is the peer's word, and a header that
// claims a gigabyte must not cost one before the bytes come.
func (p *planeConn) next(n int) ([]byte, error) {
	for p.w-p.r < n {
		if err := p.fill(); err != nil {
			return nil, err
		}
	}
	b := p.in[p.r : p.r+n]
	p.r += n
	return b, nil
}

// readFrame reads one frame: its header and its body, valid until the next
// read.
func (p *planeConn) readFrame() (hdr [frameHeader]byte, body []byte, err error) {
	h, err := p.next(frameHeader)
	if err != nil {
		return hdr, nil, err
	}
	copy(hdr[:], h)
	n := binary.LittleEndian.Uint32(hdr[0:])
	if n > MaxMessageBytes {
		return hdr, nil, fmt.Errorf("frame of %d bytes exceeds the limit of %d", n, MaxMessageBytes)
	}
	body, err = p.next(int(n))
	return hdr, body, err
}

// write writes all of b.
func (p *planeConn) write(b []byte) error {
	if p.shm != nil {
		return p.shm.write(b)
	}
	for len(b) > 0 {
		var n int
		var werr error
		err := p.rc.Write(func(fd uintptr) bool {
			n, werr = rawWrite(fd, b)
			return werr != syscall.EAGAIN
		})
		if err != nil {
			return err
		}
		if werr != nil {
			return werr
		}
		b = b[n:]
	}
	return nil
}

// readAside blocks until the peer closes its end (io.EOF), the connection
// fails, or the read deadline passes (errors.Is os.ErrDeadlineExceeded),
// keeping whatever arrives meanwhile (the next calls, pipelined) in
// p.aside; takeAside moves it into the buffer. It leaves the buffer alone,
// so a frame read from it stays valid: the watcher of a running call uses
// it.
func (p *planeConn) readAside() error {
	var chunk [4096]byte
	for {
		var n int
		var rerr error
		err := p.rc.Read(func(fd uintptr) bool {
			n, rerr = readNow(fd, chunk[:])
			return rerr != syscall.EAGAIN
		})
		if err := readOutcome(err, rerr, n); err != nil {
			return err
		}
		if p.shm != nil { // doorbells: the frames wait in the ring
			continue
		}
		p.aside = append(p.aside, chunk[:n]...)
	}
}

// takeAside appends what readAside kept to the buffer's unread bytes.
func (p *planeConn) takeAside() {
	if len(p.aside) == 0 {
		return
	}
	if len(p.in)-p.w < len(p.aside) {
		in := make([]byte, max(len(p.in), p.w-p.r+len(p.aside)))
		p.w = copy(in, p.in[p.r:p.w])
		p.r, p.in = 0, in
	}
	p.w += copy(p.in[p.w:], p.aside)
	p.aside = p.aside[:0]
}

// setReadDeadline bounds the reads (of frames, and the watcher's); the
// zero time clears it.
func (p *planeConn) setReadDeadline(t time.Time) {
	if p.shm != nil {
		p.shm.setDeadline(t, true) // the socket's too
		return
	}
	_ = p.c.SetReadDeadline(t)
}

// setWriteDeadline bounds the writes; the zero time clears it.
func (p *planeConn) setWriteDeadline(t time.Time) {
	_ = p.c.SetWriteDeadline(t)
	if p.shm != nil {
		p.shm.setDeadline(t, false)
	}
}

// close closes the socket and the shared memory, if any: a read or write in
// progress returns.
func (p *planeConn) close() error {
	if p.shm != nil {
		p.shm.close()
	}
	return p.c.Close()
}
