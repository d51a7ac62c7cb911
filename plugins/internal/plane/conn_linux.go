package plane

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
	n, err := readNow(fd, b)
	if err != syscall.EAGAIN {
		return n, err
	}
	pfd := pollFd{fd: int32(fd), events: pollIn}
	ts := syscall.NsecToTimespec(int64(idleWait))
	syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	return readNow(fd, b)
}

// readNow reads from the non-blocking socket fd once: EAGAIN when nothing
// is there.
func readNow(fd uintptr, b []byte) (int, error) { return rawIO(syscall.SYS_READ, fd, b) }

// rawWrite writes to the non-blocking socket fd.
func rawWrite(fd uintptr, b []byte) (int, error) { return rawIO(syscall.SYS_WRITE, fd, b) }

// rawIO makes the read or write system call trap on the non-blocking fd
// without telling the runtime (it cannot block), again after an interrupt.
func rawIO(trap, fd uintptr, b []byte) (int, error) {
	for {
		n, _, e := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}
