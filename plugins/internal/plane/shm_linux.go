//go:build linux

package plane

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ShmSupported: data plane version 3 (frames in shared memory) is spoken.
const ShmSupported = true

// Version is the data plane version spoken here: frames in shared memory.
const Version uint32 = 3

// A data plane of version 3 moves its frames through two byte rings in a
// memory file both processes map, one ring each way, instead of through
// the socket. A frame crosses without a system call when its reader is
// polling the ring. A reader that has polled for its spin sleeps on a
// futex in the ring, holding its thread, for up to parkAfter; then it
// parks its goroutine on the socket, so the thread serves the process's
// other goroutines (gRPC calls) meanwhile. The writer wakes a sleeper with
// the futex and a parked reader with a byte on the socket: after the token
// the socket carries only such doorbells, which mean nothing else, and
// tells each end when the other one went.
//
// Layout of the memory file: the ring of requests (host to plugin), then
// the ring of answers. Each ring is ringCtl bytes of counters, each on a
// cache line of its own, then ringBytes of data.
const (
	ringCtl   = 256
	ringBytes = 1 << 21
	shmBytes  = 2 * (ringCtl + ringBytes)

	offTail        = 0   // u64: bytes written in all (the producer's)
	offHead        = 64  // u64: bytes read in all (the consumer's)
	offReaderWaits = 128 // u32: how the consumer waits (see waitState)
	offWriterWaits = 192 // u32: how the producer waits for room

	// futexSleep bounds one futex sleep: between two the waiter checks its
	// deadline, whether the plane closed and whether the peer hung up.
	futexSleep = time.Millisecond
	// parkAfter is how long a waiter sleeps on the futex before it parks on
	// the socket (the socket plane's idleWait).
	parkAfter = time.Millisecond
)

// waitState is the value of a ring's wait word: how the other end is
// waiting for it, so the writer (or reader) knows how to wake it.
const (
	running  = 0 // not waiting, or polling
	sleeping = 1 // on the futex
	parked   = 2 // on the socket
)

// shmRing is one direction of a plane: a single-producer, single-consumer
// byte ring. tail and head only grow; a byte's place is its count modulo
// the size.
type shmRing struct {
	tail, head               *uint64
	readerWaits, writerWaits *uint32
	data                     []byte
}

func ringAt(mem []byte, off int) shmRing {
	return shmRing{
		tail:        (*uint64)(unsafe.Pointer(&mem[off+offTail])),
		head:        (*uint64)(unsafe.Pointer(&mem[off+offHead])),
		readerWaits: (*uint32)(unsafe.Pointer(&mem[off+offReaderWaits])),
		writerWaits: (*uint32)(unsafe.Pointer(&mem[off+offWriterWaits])),
		data:        mem[off+ringCtl : off+ringCtl+ringBytes],
	}
}

// shmLink is one end's view of the shared memory of a plane. read and
// write may run at the same time (one goroutine each); deadlines and close
// may come from any goroutine. The mapping goes when the link is closed and
// the last read or write in progress has returned.
type shmLink struct {
	mem     []byte
	in, out shmRing
	conn    *net.UnixConn   // the plane's socket: doorbells and hang-ups
	rc      syscall.RawConn // conn's
	spin    time.Duration   // a reader's polling before it sleeps
	sleep   time.Duration   // a reader's time on the futex before it parks (parkAfter; tests lengthen it)

	rdl, wdl atomic.Int64 // deadlines in Unix ns; 0: none
	closed   atomic.Bool

	mu   sync.Mutex
	refs int // the link's own, while open, and one per read or write in progress
}

// errCorruptRing: the counters of a ring say more than it can hold; the
// other end wrote where it must not.
var errCorruptRing = errors.New("data plane: a shared-memory ring's counters are corrupt")

// newShmFile makes the memory file of a plane, for the host to map and
// hand to the plugin.
func newShmFile() (*os.File, error) {
	fd, err := unix.MemfdCreate("kvx-data-plane", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("data plane memory: %w", err)
	}
	f := os.NewFile(uintptr(fd), "kvx-data-plane")
	if err := f.Truncate(shmBytes); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("data plane memory: %w", err)
	}
	return f, nil
}

// mapShm maps the memory file f of a plane; host says which end this is.
// The file may be closed afterwards.
func mapShm(f *os.File, host bool, c *net.UnixConn) (*shmLink, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != shmBytes {
		return nil, fmt.Errorf("data plane memory of %d bytes, want %d", st.Size(), shmBytes)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, shmBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("data plane memory: %w", err)
	}
	requests, answers := ringAt(mem, 0), ringAt(mem, ringCtl+ringBytes)
	l := &shmLink{mem: mem, conn: c, rc: rc, refs: 1, in: requests, out: answers, sleep: parkAfter}
	if host {
		l.in, l.out = answers, requests
	}
	return l, nil
}

// enter takes a reference for a read or write; false once closed.
func (l *shmLink) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refs == 0 || l.closed.Load() {
		return false
	}
	l.refs++
	return true
}

// leave drops a reference; the last one unmaps.
func (l *shmLink) leave() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refs--
	if l.refs == 0 {
		_ = unix.Munmap(l.mem)
		l.mem = nil
	}
}

// close ends the link: a read or write in progress returns net.ErrClosed
// within futexSleep (a parked reader at once), and the memory is unmapped
// when it has. The socket stays open.
func (l *shmLink) close() {
	if l.closed.Swap(true) {
		return
	}
	_ = l.conn.SetReadDeadline(aLongTimeAgo) // unparks the reader
	l.leave()
}

// setDeadline sets a read (or write) deadline; the zero time clears it.
// The read deadline is the socket's too, where the reader parks.
func (l *shmLink) setDeadline(t time.Time, read bool) {
	d := &l.wdl
	if read {
		d = &l.rdl
		_ = l.conn.SetReadDeadline(t)
	}
	if t.IsZero() {
		d.Store(0)
		return
	}
	d.Store(max(t.UnixNano(), 1))
}

// available is how many bytes the reader can take now.
func (l *shmLink) available() int {
	if !l.enter() {
		return 0
	}
	defer l.leave()
	return int(atomic.LoadUint64(l.in.tail) - atomic.LoadUint64(l.in.head))
}

// read copies what the ring holds, up to len(p), into p, waiting for at
// least one byte.
func (l *shmLink) read(p []byte) (int, error) {
	if !l.enter() {
		return 0, net.ErrClosed
	}
	defer l.leave()
	r := &l.in
	head := atomic.LoadUint64(r.head)
	ready := func() bool { return atomic.LoadUint64(r.tail) != head }
	if !ready() {
		if err := l.wait(r.readerWaits, ready, &l.rdl, l.spin, true); err != nil {
			return 0, err
		}
	}
	held := atomic.LoadUint64(r.tail) - head
	if held > ringBytes {
		return 0, errCorruptRing
	}
	n := min(int(held), len(p))
	at := int(head % ringBytes)
	k := copy(p[:n], r.data[at:])
	copy(p[k:n], r.data)
	atomic.StoreUint64(r.head, head+uint64(n))
	l.wake(r.writerWaits)
	return n, nil
}

// write puts all of b in the ring, waiting for room as the reader takes it.
func (l *shmLink) write(b []byte) error {
	if !l.enter() {
		return net.ErrClosed
	}
	defer l.leave()
	r := &l.out
	for len(b) > 0 {
		tail := atomic.LoadUint64(r.tail)
		if atomic.LoadUint64(r.head) > tail {
			return errCorruptRing
		}
		room := func() bool { return int(tail-atomic.LoadUint64(r.head)) < ringBytes }
		if !room() {
			if err := l.wait(r.writerWaits, room, &l.wdl, l.spin, false); err != nil {
				return err
			}
		}
		n := min(ringBytes-int(tail-atomic.LoadUint64(r.head)), len(b))
		at := int(tail % ringBytes)
		k := copy(r.data[at:], b[:n])
		copy(r.data, b[k:n])
		atomic.StoreUint64(r.tail, tail+uint64(n))
		b = b[n:]
		l.wake(r.readerWaits)
	}
	return nil
}

// wake wakes the other end if it waits on word: it clears the word (so
// one wake-up is sent, not one a write), then wakes a sleeper with the
// futex or rings a parked waiter's socket.
func (l *shmLink) wake(word *uint32) {
	for {
		switch atomic.LoadUint32(word) {
		case running:
			return
		case sleeping:
			if atomic.CompareAndSwapUint32(word, sleeping, running) {
				futexWake(word)
				return
			}
		case parked:
			if atomic.CompareAndSwapUint32(word, parked, running) {
				l.ring()
				return
			}
		}
	}
}

// ring writes a doorbell byte on the socket. A full socket already holds
// doorbells the peer has yet to read, so that one is dropped.
func (l *shmLink) ring() {
	b := [1]byte{1}
	_ = l.rc.Write(func(fd uintptr) bool {
		_, _ = rawWrite(fd, b[:])
		return true
	})
}

// wait returns once ready does, or with the deadline's error, net.ErrClosed
// or io.EOF (the peer hung up). It polls for spin, then sleeps on the
// futex; the reader of frames (reader true) parks on the socket after
// l.sleep (parkAfter). Before it sleeps or parks it says so in word and looks at
// ready once more; the other end changes what ready sees before it reads
// word: whichever of the two comes second sees the other's store (both are
// sequentially consistent), so no wake-up is lost.
//
// Only the reader uses the socket (one goroutine at a time reads frames):
// a writer waiting for room sleeps on the futex until there is room, the
// link closes (the plane closes it when the peer's process or connection
// goes) or its deadline passes. Doorbells are all for the reader.
func (l *shmLink) wait(word *uint32, ready func() bool, deadline *atomic.Int64, spin time.Duration, reader bool) error {
	check := func() error {
		if l.closed.Load() {
			return net.ErrClosed
		}
		if dl := deadline.Load(); dl != 0 && time.Now().UnixNano() >= dl {
			return os.ErrDeadlineExceeded
		}
		return nil
	}
	start := time.Now()
	if spin > 0 {
		// A tight loop: the runtime preempts it like any other when it must.
		for i := 1; ; i++ {
			if ready() {
				return nil
			}
			if i%256 == 0 {
				if err := check(); err != nil {
					return err
				}
				if time.Since(start) > spin {
					break
				}
			}
		}
	}
	for !reader || time.Since(start) < spin+l.sleep {
		if err := check(); err != nil {
			return err
		}
		atomic.StoreUint32(word, sleeping)
		if ready() {
			atomic.StoreUint32(word, running)
			return nil
		}
		futexWait(word, sleeping, futexSleep)
		atomic.StoreUint32(word, running)
		if ready() {
			return nil
		}
		if !reader {
			continue
		}
		if err := l.peerGone(); err != nil {
			return err
		}
	}
	for {
		if err := check(); err != nil {
			return err
		}
		atomic.StoreUint32(word, parked)
		if ready() {
			// A doorbell may come all the same; the next wait drains it.
			atomic.CompareAndSwapUint32(word, parked, running)
			return nil
		}
		err := l.park()
		atomic.CompareAndSwapUint32(word, parked, running)
		if ready() {
			return nil
		}
		if err != nil {
			if l.closed.Load() {
				return net.ErrClosed
			}
			return err
		}
	}
}

// park waits on the socket, in the netpoller, for a doorbell (nil), the
// peer's hang-up (io.EOF), the read deadline or a failure.
func (l *shmLink) park() error { return l.readSocket(true) }

// peerGone reads the socket without waiting: io.EOF when the peer closed
// it (or its process died), an error when it failed, nil while it is quiet
// or holds doorbells (which it drops).
func (l *shmLink) peerGone() error { return l.readSocket(false) }

// readSocket reads doorbells off the socket, dropping them; block waits
// for one when there is none.
func (l *shmLink) readSocket(block bool) error {
	var b [64]byte
	var n int
	var rerr error
	err := l.rc.Read(func(fd uintptr) bool {
		n, rerr = readNow(fd, b[:])
		return !block || rerr != syscall.EAGAIN
	})
	if err == nil && rerr == syscall.EAGAIN { // only when not blocking
		return nil
	}
	return readOutcome(err, rerr, n)
}

// Futex operations, shared between processes (no FUTEX_PRIVATE_FLAG).
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *word == val, for at most d. The call is raw (the
// runtime is not told); d bounds it, and a signal (the runtime preempting
// the goroutine) ends it early.
func futexWait(word *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	_, _, _ = unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWaitOp,
		uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes the sleeper on word, in either process.
func futexWake(word *uint32) {
	_, _, _ = unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWakeOp, 1, 0, 0, 0)
}

// sendShm sends the token and the memory file f on c, in one message.
func sendShm(c *net.UnixConn, token []byte, f *os.File) error {
	_, _, err := c.WriteMsgUnix(token, unix.UnixRights(int(f.Fd())), nil)
	return err
}

// recvShm reads the token and the memory file a host sent with sendShm.
func recvShm(c *net.UnixConn, n int) ([]byte, *os.File, error) {
	token := make([]byte, n)
	oob := make([]byte, unix.CmsgSpace(4))
	got, oobn, _, _, err := c.ReadMsgUnix(token, oob)
	if err != nil {
		return nil, nil, err
	}
	var f *os.File
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				if f == nil {
					f = os.NewFile(uintptr(fd), "kvx-data-plane")
				} else {
					_ = unix.Close(fd)
				}
			}
		}
	}
	if f == nil {
		return nil, nil, errors.New("data plane: no memory file came with the token")
	}
	for got < n {
		k, err := c.Read(token[got:])
		if err != nil {
			_ = f.Close()
			return nil, nil, err
		}
		got += k
	}
	return token, f, nil
}
