//go:build !linux

package plane

import (
	"syscall"
)

// readSoon reads from the non-blocking socket fd; EAGAIN sends the caller
// to the netpoller.
func readSoon(fd uintptr, b []byte) (int, error) { return readNow(fd, b) }

func readNow(fd uintptr, b []byte) (int, error) {
	return retryEINTR(func() (int, error) { return syscall.Read(int(fd), b) })
}

func rawWrite(fd uintptr, b []byte) (int, error) {
	return retryEINTR(func() (int, error) { return syscall.Write(int(fd), b) })
}

func retryEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		return n, nil
	}
}
