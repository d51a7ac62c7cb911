//go:build !linux

package plane

import (
	"errors"
	"net"
	"os"
	"time"
)

// ShmSupported: data plane version 3 (frames in shared memory) needs Linux.
const ShmSupported = false

// Version is the data plane version spoken here: frames on the socket.
const Version uint32 = 2

var errNoShm = errors.New("data plane: shared memory needs Linux")

// shmLink is not built here; a plane never has one.
type shmLink struct{ spin time.Duration }

func newShmFile() (*os.File, error)                          { return nil, errNoShm }
func mapShm(*os.File, bool, *net.UnixConn) (*shmLink, error) { return nil, errNoShm }
func sendShm(*net.UnixConn, []byte, *os.File) error          { return errNoShm }
func recvShm(*net.UnixConn, int) ([]byte, *os.File, error)   { return nil, nil, errNoShm }
func (*shmLink) read([]byte) (int, error)                    { return 0, errNoShm }
func (*shmLink) write([]byte) error                          { return errNoShm }
func (*shmLink) available() int                              { return 0 }
func (*shmLink) close()                                      {}
func (*shmLink) setDeadline(time.Time, bool)                 {}
