package pluginrpc

import (
	"syscall"
	"unsafe"
)

// pollFd is struct pollfd.
type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

const pollIn = 0x1

// readSoon reads from the non-blocking socket fd, first waiting in one
// ppoll for up to idleWait when nothing is there yet. It returns EAGAIN
// when nothing came, for the caller to park in the netpoller. The calls are
// raw: the runtime is not told, so it does not wake its monitor thread for
// them; the wait is bounded so the thread comes back soon.
func readSoon(fd uintptr, b []byte) (int, error) {
	for tries := 0; ; tries++ {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e == 0 {
			return int(n), nil
		}
		if e != syscall.EAGAIN && e != syscall.EINTR {
			return 0, e
		}
		if tries > 0 {
			return 0, syscall.EAGAIN
		}
		pfd := pollFd{fd: int32(fd), events: pollIn}
		ts := syscall.NsecToTimespec(int64(idleWait))
		syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	}
}

// readNow reads from the non-blocking socket fd once: EAGAIN when nothing
// is there.
func readNow(fd uintptr, b []byte) (int, error) {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// rawWrite writes to the non-blocking socket fd without telling the
// runtime (it cannot block).
func rawWrite(fd uintptr, b []byte) (int, error) {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// peek looks at what is waiting on fd without consuming it.
func peek(fd uintptr, b []byte) (int, error) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
