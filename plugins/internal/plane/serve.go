package plane

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
)

// Handler runs one framed call: it decodes the request message from b and
// returns the response message, or an error that is (or becomes) a status.
// ch carries Forward's chain state between frames (see FlagKeep).
type Handler func(ctx context.Context, b []byte, ch *Chain) (proto.Message, error)

// Chain is a serve loop's state for the frames of a ForwardChain.
type Chain struct {
	Flags byte   // of the frame being served
	Kept  []byte // the Result.Hidden a FlagKeep frame left for the next frame
	OK    bool   // the last frame was a FlagKeep frame that succeeded
}

// Route returns the handlers of an instance.
type Route func(inst uint16) (map[Method]Handler, error)

// Handle adapts one server method to a Handler.
func Handle[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](f func(context.Context, PReq) (Resp, error)) Handler {
	return func(ctx context.Context, b []byte, _ *Chain) (proto.Message, error) {
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "data plane: undecodable request: %v", err)
		}
		return f(ctx, req)
	}
}

// Serve serves one OpenDataPlane call: it listens on a fresh socket
// in a private directory, sends where to connect, serves the first
// connection that presents the token with the handlers of the instance each
// frame names (routes), and returns when the
// plane or the RPC's stream ends, whichever comes first. The socket and its
// directory are removed once a connection is accepted (or none came within
// acceptWait). Framed calls run under the stream's ctx, so they end with the
// gRPC connection like any RPC.
func Serve(req *kvxpb.DataPlaneRequest, stream grpc.ServerStreamingServer[kvxpb.DataPlane], routes Route) error {
	v := req.GetVersion()
	if v != Version {
		return status.Errorf(codes.Unimplemented, "data plane version %d is not served (this plugin speaks %d)", v, Version)
	}
	// Beside go-plugin's own socket when the host chose a directory for them
	// (core/host does: a private one); mode 0700 either way.
	dir, err := os.MkdirTemp(os.Getenv(plugin.EnvUnixSocketDir), "kvx-dp-")
	if err != nil {
		return status.Errorf(codes.Unavailable, "data plane: %v", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return status.Errorf(codes.Unavailable, "data plane: %v", err)
	}
	defer l.Close()
	token := make([]byte, tokenBytes)
	_, _ = rand.Read(token) // never fails (crypto/rand)
	if err := stream.Send(&kvxpb.DataPlane{Network: "unix", Address: path, Token: token, Version: v}); err != nil {
		return err
	}
	ctx := stream.Context()
	_ = l.SetDeadline(time.Now().Add(acceptWait))
	stopAccept := context.AfterFunc(ctx, func() { _ = l.SetDeadline(aLongTimeAgo) })
	c, err := l.AcceptUnix()
	stopAccept()
	_ = l.Close()
	_ = os.RemoveAll(dir)
	if err != nil {
		return status.Errorf(codes.Unavailable, "data plane: no connection: %v", err)
	}
	pc, err := acceptPlane(c, token)
	if err != nil {
		_ = c.Close()
		return nil // a connection without the token, or a broken one: serve nothing
	}
	defer pc.close()
	stopServe := context.AfterFunc(ctx, func() { _ = pc.close() })
	defer stopServe()
	serveFrames(ctx, pc, routes)
	return nil
}

// acceptPlane checks the token the host sent on c, and with shared memory
// (version 3) maps the memory file that came with it.
func acceptPlane(c *net.UnixConn, token []byte) (*planeConn, error) {
	_ = c.SetReadDeadline(time.Now().Add(acceptWait))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	if !ShmSupported {
		pc, err := newPlaneConn(c)
		if err != nil {
			return nil, err
		}
		got, err := pc.next(len(token))
		if err != nil || subtle.ConstantTimeCompare(got, token) != 1 {
			return nil, errors.New("data plane: bad token")
		}
		return pc, nil
	}
	got, f, err := recvShm(c, len(token))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if subtle.ConstantTimeCompare(got, token) != 1 {
		return nil, errors.New("data plane: bad token")
	}
	pc, err := newPlaneConn(c)
	if err != nil {
		return nil, err
	}
	if pc.shm, err = mapShm(f, false, c); err != nil {
		return nil, err
	}
	pc.shm.spin = serveSpin
	return pc, nil
}

// serveFrames answers framed calls on c, one at a time, until c fails or
// sends something that is not a frame. Each frame goes to the instance it
// names. An answer is written when no further frame is already read, so
// the answers to frames that came together go back together. The handlers take the server's gate
// themselves, so framed and gRPC calls never overlap. A call that runs past
// watchAfter is watched: the host closing the plane (it does when the
// caller's ctx ends mid-call) cancels it, as gRPC would. Shorter calls are
// not worth a second goroutine.
func serveFrames(ctx context.Context, pc *planeConn, routes Route) {
	var out []byte
	var ch Chain
	// A hang-up ends the plane, so it cancels every call at once: a call
	// without a deadline runs under planeCtx itself.
	planeCtx, cancelPlane := context.WithCancel(ctx)
	defer cancelPlane()
	watch := newHangUpWatch(pc, cancelPlane)
	for {
		hdr, body, err := pc.readFrame()
		if err != nil {
			return
		}
		inst, flags := binary.LittleEndian.Uint16(hdr[5:]), hdr[7]
		ch.Flags = flags
		if ch.Flags&FlagTake == 0 {
			ch.Kept, ch.OK = nil, false
		}
		cctx, cancel := planeCtx, context.CancelFunc(nil)
		if dl := int64(binary.LittleEndian.Uint64(hdr[8:])); dl != 0 {
			cctx, cancel = context.WithDeadline(planeCtx, time.Unix(0, dl))
		}
		watch.start()
		var resp proto.Message
		handlers, err := routes(inst)
		if err == nil {
			if h := handlers[Method(hdr[4])]; h != nil {
				resp, err = h(cctx, body, &ch)
			} else {
				err = status.Errorf(codes.Unimplemented, "data plane: method %d is not served", hdr[4])
			}
		}
		hungUp := watch.stop()
		if cancel != nil {
			cancel()
		}
		if hungUp {
			return
		}
		out, err = appendResponse(out, resp, err)
		if err != nil {
			return
		}
		if pc.buffered() >= frameHeader {
			continue // the next call came with this one: answer both at once
		}
		if err := pc.write(out); err != nil {
			return
		}
		out = out[:0]
	}
}

// watchAfter is how long a framed call runs before the plugin watches for
// the host hanging up on it.
const watchAfter = time.Millisecond

// hangUpWatch watches pc for the host hanging up on a call that has run
// for watchAfter, and cancels the plane's calls then. Frames that arrive
// meanwhile (other instances' calls, pipelined) are kept for after the
// call. One timer serves every call of a plane.
type hangUpWatch struct {
	pc     *planeConn
	cancel context.CancelFunc
	t      *time.Timer
	done   chan struct{} // a token when a watch that fired has ended
	hungUp atomic.Bool
}

func newHangUpWatch(pc *planeConn, cancel context.CancelFunc) *hangUpWatch {
	w := &hangUpWatch{pc: pc, cancel: cancel, done: make(chan struct{}, 1)}
	w.t = time.AfterFunc(time.Hour, w.watch)
	w.t.Stop()
	return w
}

func (w *hangUpWatch) watch() {
	if err := w.pc.readAside(); !errors.Is(err, os.ErrDeadlineExceeded) {
		// EOF or a reset: the call is abandoned.
		w.hungUp.Store(true)
		w.cancel()
	}
	w.done <- struct{}{}
}

// start arms the watch for a call.
func (w *hangUpWatch) start() { w.t.Reset(watchAfter) }

// stop ends the watch of a call (waiting for the watcher, which holds pc's
// read side, when it fired) and reports whether the host hung up.
func (w *hangUpWatch) stop() bool {
	if w.t.Stop() {
		return false
	}
	_ = w.pc.c.SetReadDeadline(aLongTimeAgo) // the watcher reads the socket only
	<-w.done
	_ = w.pc.c.SetReadDeadline(time.Time{})
	w.pc.takeAside()
	return w.hungUp.Load()
}

// Sole routes the frames of a process that serves one instance.
func Sole(handlers func() map[Method]Handler) Route {
	return func(inst uint16) (map[Method]Handler, error) {
		if inst != 0 {
			return nil, status.Errorf(codes.InvalidArgument, "data plane: instance %d: this plugin process serves one instance", inst)
		}
		return handlers(), nil
	}
}
