//go:build linux

package plane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// socketPair returns the two ends of a connected unix socket.
func socketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// shmPair maps one plane's memory twice, as the host and the plugin do in
// their processes, each end with its socket.
func shmPair(t testing.TB) (host, plugin *shmLink, hostConn, pluginConn *net.UnixConn) {
	t.Helper()
	f, err := newShmFile()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hostConn, pluginConn = socketPair(t)
	if host, err = mapShm(f, true, hostConn); err != nil {
		t.Fatal(err)
	}
	if plugin, err = mapShm(f, false, pluginConn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		host.close()
		plugin.close()
		_ = hostConn.Close()
		_ = pluginConn.Close()
	})
	return host, plugin, hostConn, pluginConn
}

// TestShmRingsCarryBytes: random writes, some larger than a ring, read
// with random buffer sizes, arrive whole and in order, both ways at once.
func TestShmRingsCarryBytes(t *testing.T) {
	pattern := make([]byte, 4*ringBytes*3/2) // the most the writes below send
	for i := range pattern {
		pattern[i] = byte(i*7 + i>>11)
	}
	rapid.Check(t, func(rt *rapid.T) {
		host, plugin, _, _ := shmPair(t)
		host.spin = time.Duration(rapid.IntRange(0, 50).Draw(rt, "spin µs")) * time.Microsecond
		sizes := rapid.SliceOfN(rapid.OneOf(rapid.IntRange(1, 4096), rapid.IntRange(1, 64<<10),
			rapid.IntRange(ringBytes-10, ringBytes+ringBytes/2)), 1, 4).Draw(rt, "writes")
		bufSize := rapid.IntRange(1, 3*ringBytes/2).Draw(rt, "read buffer")
		total := 0
		for _, n := range sizes {
			total += n
		}
		want := pattern[:total]
		bufSize = max(bufSize, total>>12) // at most 4096 reads a check
		send := func(to *shmLink, errs chan<- error) {
			for i, off := 0, 0; i < len(sizes); i++ {
				if err := to.write(want[off : off+sizes[i]]); err != nil {
					errs <- err
					return
				}
				off += sizes[i]
			}
			errs <- nil
		}
		recv := func(from *shmLink) ([]byte, error) {
			from.setDeadline(time.Now().Add(20*time.Second), true)
			got := make([]byte, 0, len(want))
			buf := make([]byte, bufSize)
			for len(got) < len(want) {
				n, err := from.read(buf[:min(len(buf), len(want)-len(got))])
				if err != nil {
					return got, err
				}
				got = append(got, buf[:n]...)
			}
			return got, nil
		}
		errs := make(chan error, 2)
		go send(host, errs)   // requests
		go send(plugin, errs) // answers
		for _, end := range []*shmLink{plugin, host} {
			got, err := recv(end)
			if err != nil || !bytes.Equal(got, want) {
				rt.Fatalf("read %d of %d bytes, %v; equal %v", len(got), len(want), err, bytes.Equal(got, want))
			}
		}
		for range 2 {
			if err := <-errs; err != nil {
				rt.Fatalf("write: %v", err)
			}
		}
		if host.available() != 0 || plugin.available() != 0 {
			rt.Fatalf("bytes left over: %d, %d", host.available(), plugin.available())
		}
	})
}

// TestShmWriterWakesTheWaiter: a reader that sleeps on the futex, or has
// parked on the socket, says so in the ring, and the write that follows
// clears that and wakes it.
func TestShmWriterWakesTheWaiter(t *testing.T) {
	for _, state := range []uint32{sleeping, parked} {
		t.Run(fmt.Sprint("state ", state), func(t *testing.T) {
			host, plugin, _, _ := shmPair(t)
			if state == sleeping {
				// Keep the reader on the futex: after parkAfter (1 ms) it
				// would park, and a test slowed by the race detector or a
				// busy machine could look only then.
				plugin.sleep = time.Hour
			}
			got := make(chan []byte, 1)
			go func() {
				buf := make([]byte, 8)
				n, err := plugin.read(buf)
				if err != nil {
					t.Error(err)
				}
				got <- buf[:n]
			}()
			for deadline := time.Now().Add(5 * time.Second); atomic.LoadUint32(plugin.in.readerWaits) != state; runtime.Gosched() {
				if time.Now().After(deadline) {
					t.Fatalf("the reader never reached wait state %d", state)
				}
			}
			if err := host.write([]byte("wake")); err != nil {
				t.Fatal(err)
			}
			if w := atomic.LoadUint32(plugin.in.readerWaits); w != running && w != state {
				t.Errorf("after the write the wait state is %d", w)
			}
			select {
			case b := <-got:
				if string(b) != "wake" {
					t.Errorf("read %q", b)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the reader did not wake")
			}
		})
	}
}

// TestShmHangUpDeadlineClose: a waiting reader returns io.EOF when the
// peer's socket closes, os.ErrDeadlineExceeded at its deadline, and
// net.ErrClosed when its own end closes, whether it sleeps on the futex or
// parks on the socket; a writer waiting for room returns at its deadline
// and when its end closes (the plane closes it when the peer goes).
func TestShmHangUpDeadlineClose(t *testing.T) {
	wait := func(t *testing.T, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("still waiting after 10 s")
			return nil
		}
	}
	read := func(l *shmLink) func() error {
		return func() error { _, err := l.read(make([]byte, 1)); return err }
	}
	for _, after := range []time.Duration{parkAfter / 4, 20 * parkAfter} { // on the futex, parked
		t.Run(fmt.Sprintf("hang-up after %v", after), func(t *testing.T) {
			_, plugin, hostConn, _ := shmPair(t)
			time.AfterFunc(after, func() { _ = hostConn.Close() })
			if err := wait(t, read(plugin)); err != io.EOF {
				t.Errorf("read after the host hung up: %v, want EOF", err)
			}
		})
	}
	t.Run("deadline", func(t *testing.T) {
		host, plugin, _, _ := shmPair(t)
		plugin.setDeadline(time.Now().Add(20*time.Millisecond), true)
		if err := wait(t, read(plugin)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read past its deadline: %v", err)
		}
		plugin.setDeadline(time.Time{}, true)
		if err := host.write([]byte{7}); err != nil {
			t.Fatal(err)
		}
		if err := wait(t, read(plugin)); err != nil {
			t.Errorf("read once the deadline is cleared: %v", err)
		}
	})
	t.Run("close", func(t *testing.T) {
		_, plugin, _, _ := shmPair(t)
		closed := make(chan struct{})
		time.AfterFunc(20*time.Millisecond, func() {
			plugin.close()
			close(closed)
		})
		if err := wait(t, read(plugin)); !errors.Is(err, net.ErrClosed) {
			t.Errorf("read when its end closed: %v", err)
		}
		<-closed // the read may see the close before close has unmapped
		if err := plugin.write([]byte{1}); !errors.Is(err, net.ErrClosed) {
			t.Errorf("write after close: %v", err)
		}
		if plugin.mem != nil {
			t.Error("the memory is still mapped after close")
		}
	})
	t.Run("full ring", func(t *testing.T) {
		host, _, _, _ := shmPair(t)
		if err := host.write(make([]byte, ringBytes)); err != nil {
			t.Fatal(err)
		}
		host.setDeadline(time.Now().Add(20*time.Millisecond), false)
		if err := wait(t, func() error { return host.write([]byte{1}) }); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("write to a full ring past its deadline: %v", err)
		}
		host.setDeadline(time.Time{}, false)
		time.AfterFunc(20*time.Millisecond, host.close)
		if err := wait(t, func() error { return host.write([]byte{1}) }); !errors.Is(err, net.ErrClosed) {
			t.Errorf("write to a full ring when its end closed: %v", err)
		}
	})
}

// TestShmNeedsTheToken: a version 3 connection with the memory file but a
// wrong token is hung up on before any call reaches the manager.
func TestShmNeedsTheToken(t *testing.T) {
	s := &server{}
	dp := openRaw(t, s, 3)
	dp.Token = bytes.Repeat([]byte{1}, tokenBytes)
	plane, err := Dial(ctx, dp)
	if err != nil {
		t.Fatal(err)
	}
	defer plane.Shut(errors.New("test over"))
	plane.pc.setReadDeadline(time.Now().Add(10 * time.Second))
	if err := plane.pc.fill(); err != io.EOF {
		t.Errorf("read after a wrong token: %v, want EOF", err)
	}
	if n := s.seen(); n != 0 {
		t.Errorf("manager saw %d calls, want none", n)
	}
}

// TestShmCorruptCounters: counters that say a ring holds more than it can,
// or was read past what was written, are an error, not a wild read.
func TestShmCorruptCounters(t *testing.T) {
	host, plugin, _, _ := shmPair(t)
	atomic.StoreUint64(host.out.tail, ringBytes+1) // the plugin's ring of requests
	if _, err := plugin.read(make([]byte, 16)); !errors.Is(err, errCorruptRing) {
		t.Errorf("read of an overfull ring: %v", err)
	}
	atomic.StoreUint64(plugin.in.head, ringBytes+2) // read past what was written
	if err := host.write([]byte{1}); !errors.Is(err, errCorruptRing) {
		t.Errorf("write after the reader overran: %v", err)
	}
}
