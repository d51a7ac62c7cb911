package pluginrpc

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-plugin"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
)

// The data plane: the per-step calls as length-prefixed frames of the RPCs'
// own messages on a private local socket, beside the gRPC connection (the
// frame format is documented at DataPlane in kvx.proto).
//
// Why: every call of a step crosses processes. Over gRPC a unary call costs
// about twenty system calls on the two sides (HTTP/2 frames, the netpoller,
// goroutine hand-offs between the reader, the handler and the writer); on a
// virtual machine with page-table isolation those dominate a sim replay. A
// frame costs one write and one read per side. gRPC stays the control plane
// (the handshake, Info, Configure, Stats, Inspect, Health) and the fallback:
// a plugin that does not open a data plane is called over gRPC for
// everything, and a client made with GRPCOnly never asks.

// ClientOption configures a ManagerClient or WorkerClient.
type ClientOption func(*clientOptions)

type clientOptions struct {
	grpcOnly bool
}

// GRPCOnly keeps every call of the client on gRPC: it never opens a data
// plane (for comparisons, and for plugins whose host cannot share a local
// socket).
func GRPCOnly() ClientOption { return func(o *clientOptions) { o.grpcOnly = true } }

func clientOpts(opts []ClientOption) clientOptions {
	var o clientOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Data plane versions. Version 2 adds an instance (u16, header bytes 5-6)
// and flags (byte 7) to request frames; in version 1 those bytes are zero.
// Version 3 is version 2's frames in shared memory (shmLink), on Linux.
// dataPlaneVersion, the newest this package speaks, is 3 on Linux and 2
// elsewhere (shm_*.go). A plugin serves every version it speaks; a host
// asks for the newest when the plugin serves instances (InstancesProtocol),
// and for 2 when the plugin does not serve 3 (an older plugin, or one on
// another system).

// servesVersion reports whether this package serves data plane version v.
func servesVersion(v uint32) bool { return v >= 1 && v <= dataPlaneVersion }

const (
	frameHeader = 16 // u32 length, u8 method or status, u16 instance, u8 flags, i64 deadline
	tokenBytes  = 32
	// acceptWait bounds how long a plugin waits for the host to connect.
	acceptWait = 30 * time.Second
)

// method numbers the RPCs a data plane carries. Append only.
type method uint8

const (
	mLookup method = iota + 1
	mReserve
	mUnreserve
	mCommit
	mSuspend
	mResume
	mRelease
	mEndStep
	mForward
	mCopyBlocks
)

// Response status byte.
const (
	frameOK  = 0
	frameErr = 1
)

// handler runs one framed call: it decodes the request message from b and
// returns the response message, or an error that is (or becomes) a status.
// ch carries Forward's chain state between frames (see flagKeep).
type handler func(ctx context.Context, b []byte, ch *chain) (proto.Message, error)

// chain is a serve loop's state for the frames of a ForwardChain.
type chain struct {
	flags byte   // of the frame being served
	kept  []byte // the Result.Hidden a flagKeep frame left for the next frame
	ok    bool   // the last frame was a flagKeep frame that succeeded
}

// route returns the handlers of an instance.
type route func(inst uint16) (map[method]handler, error)

// handle adapts one server method to a handler.
func handle[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](f func(context.Context, PReq) (Resp, error)) handler {
	return func(ctx context.Context, b []byte, _ *chain) (proto.Message, error) {
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "data plane: undecodable request: %v", err)
		}
		return f(ctx, req)
	}
}

// serveDataPlane serves one OpenDataPlane call: it listens on a fresh socket
// in a private directory, sends where to connect, serves the first
// connection that presents the token with the handlers of the instance each
// frame names (routes), and returns when the
// plane or the RPC's stream ends, whichever comes first. The socket and its
// directory are removed once a connection is accepted (or none came within
// acceptWait). Framed calls run under the stream's ctx, so they end with the
// gRPC connection like any RPC.
func serveDataPlane(req *kvxpb.DataPlaneRequest, stream grpc.ServerStreamingServer[kvxpb.DataPlane], routes route) error {
	v := req.GetVersion()
	if !servesVersion(v) {
		return status.Errorf(codes.Unimplemented, "data plane version %d is not served (this plugin speaks 1 to %d)", v, dataPlaneVersion)
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
	pc, err := acceptPlane(c, token, v)
	if err != nil {
		_ = c.Close()
		return nil // a connection without the token, or a broken one: serve nothing
	}
	defer pc.close()
	stopServe := context.AfterFunc(ctx, func() { _ = pc.close() })
	defer stopServe()
	serveFrames(ctx, pc, v >= 2, routes)
	return nil
}

// acceptPlane checks the token the host sent on c, and on version 3 maps
// the memory file that came with it.
func acceptPlane(c *net.UnixConn, token []byte, v uint32) (*planeConn, error) {
	_ = c.SetReadDeadline(time.Now().Add(acceptWait))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	if v < 3 {
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
// sends something that is not a frame. With instanced frames (version 2)
// each goes to the instance it names, else to instance 0. An answer is
// written when no further frame is already read, so the answers to frames
// that came together go back together. The handlers take the server's gate
// themselves, so framed and gRPC calls never overlap. A call that runs past
// watchAfter is watched: the host closing the plane (it does when the
// caller's ctx ends mid-call) cancels it, as gRPC would. Shorter calls are
// not worth a second goroutine.
func serveFrames(ctx context.Context, pc *planeConn, instanced bool, routes route) {
	var out []byte
	var ch chain
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
		var inst uint16
		ch.flags = 0
		if instanced {
			inst, ch.flags = binary.LittleEndian.Uint16(hdr[5:]), hdr[7]
		}
		if ch.flags&flagTake == 0 {
			ch.kept, ch.ok = nil, false
		}
		cctx, cancel := planeCtx, context.CancelFunc(nil)
		if dl := int64(binary.LittleEndian.Uint64(hdr[8:])); dl != 0 {
			cctx, cancel = context.WithDeadline(planeCtx, time.Unix(0, dl))
		}
		watch.start()
		var resp proto.Message
		handlers, err := routes(inst)
		if err == nil {
			if h := handlers[method(hdr[4])]; h != nil {
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

// appendResponse appends the response frame of (resp, callErr) to b.
func appendResponse(b []byte, resp proto.Message, callErr error) ([]byte, error) {
	at := len(b)
	b = append(b, make([]byte, frameHeader)...)
	var err error
	if callErr != nil {
		b[at+4] = frameErr
		b, err = proto.MarshalOptions{}.MarshalAppend(b, status.Convert(callErr).Proto())
	} else {
		b, err = proto.MarshalOptions{}.MarshalAppend(b, resp)
	}
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-frameHeader))
	return b, nil
}

// dataPlane is the host end of a data plane. It is safe for concurrent use
// and pipelined: a call writes its frame and then waits for its answer, so
// calls of several goroutines (the pipeline stages' instances of one plugin
// process) are in the plugin together and it serves them in one wake-up.
// Answers come in the order of the frames; whichever caller is waiting
// reads them, each into its own call's message.
type dataPlane struct {
	conn      *net.UnixConn
	pc        *planeConn
	instanced bool // frames carry instance ids (data plane version 2)

	// wmu is held across a write: frames go out in the order of queue.
	wmu sync.Mutex
	buf []byte // the frames being written (wmu)

	// qmu guards the calls' state. It is never held across a read or a
	// write, so a writer blocked on a full socket never keeps the reader
	// from draining answers (nor the plugin from finishing its write).
	qmu       sync.Mutex
	corkedOut []byte     // the corked calls' frames, not yet written
	corked    []*pending // in corkedOut's order
	queue     []*pending // written (or being written), in order; their answers not yet read
	broken    error      // set on the first transport failure; the plane is closed then

	// rmu is held by the caller that reads answers.
	rmu sync.Mutex
}

// pending is one call on the plane: written (or corked), then answered.
// Its fields are set once before done is: by the reader that took it off
// the queue, or under qmu when the plane breaks.
type pending struct {
	ctx  context.Context
	resp proto.Message // nil: the answer is read and dropped
	err  error
	done atomic.Bool
}

// frameFlags are bits of a request frame's byte 7 (data plane version 2).
const (
	// flagKeep: this Forward's Result.Hidden stays in the plugin for the
	// next frame instead of crossing back (ForwardChain).
	flagKeep = 1 << 0
	// flagTake: this Forward's Batch.Hidden is what the previous frame
	// kept; the call fails, unrun, when that frame failed.
	flagTake = 1 << 1
)

// dialDataPlane connects to the plane a plugin opened and presents its token.
func dialDataPlane(ctx context.Context, dp *kvxpb.DataPlane) (*dataPlane, error) {
	v := dp.GetVersion()
	if dp.GetNetwork() != "unix" || !servesVersion(v) {
		return nil, fmt.Errorf("data plane %s version %d is not spoken here (unix, 1 to %d)", dp.GetNetwork(), v, dataPlaneVersion)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", dp.GetAddress())
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	var shm *shmLink
	if v >= 3 {
		shm, err = offerShm(conn, dp.GetToken())
	} else {
		_, err = conn.Write(dp.GetToken())
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	plane, err := newDataPlane(conn)
	if err != nil {
		if shm != nil {
			shm.close()
		}
		return nil, err
	}
	plane.instanced = v >= 2
	if shm != nil {
		shm.spin = shmReplySpin
		plane.pc.shm = shm
	}
	return plane, nil
}

// offerShm makes and maps the memory of a version 3 plane and sends it to
// the plugin with the token.
func offerShm(conn *net.UnixConn, token []byte) (*shmLink, error) {
	f, err := newShmFile()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	shm, err := mapShm(f, true, conn)
	if err != nil {
		return nil, err
	}
	if err := sendShm(conn, token, f); err != nil {
		shm.close()
		return nil, err
	}
	return shm, nil
}

func newDataPlane(conn *net.UnixConn) (*dataPlane, error) {
	pc, err := newPlaneConn(conn)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	pc.spin = replySpin
	return &dataPlane{conn: conn, pc: pc}, nil
}

// isShut reports whether the plane was closed.
func (d *dataPlane) isShut() bool {
	d.qmu.Lock()
	defer d.qmu.Unlock()
	return d.broken != nil
}

// shut closes the plane for good with cause; calls in flight fail.
func (d *dataPlane) shut(cause error) {
	_ = d.pc.close() // first, so that a blocked read or write returns
	d.qmu.Lock()
	defer d.qmu.Unlock()
	d.breakLocked(cause)
}

// breakLocked marks the plane broken with cause (the first cause stays),
// closes it and fails every call not yet answered. Called with qmu held.
func (d *dataPlane) breakLocked(cause error) {
	if d.broken == nil {
		d.broken = cause
		_ = d.pc.close()
	}
	err := d.closedErr()
	for _, p := range d.queue {
		p.fail(err)
	}
	for _, p := range d.corked {
		p.fail(err)
	}
	d.queue, d.corked, d.corkedOut = nil, nil, d.corkedOut[:0]
}

func (d *dataPlane) closedErr() error {
	return status.Errorf(codes.Unavailable, "data plane closed after an earlier failure: %v", d.broken)
}

func (p *pending) fail(err error) {
	if !p.done.Load() {
		p.err = err
		p.done.Store(true)
	}
}

// aLongTimeAgo is a deadline that has passed: setting it unblocks a pending
// read or write at once.
var aLongTimeAgo = time.Unix(1, 0)

// call sends req as method m to instance inst and decodes the answer into
// resp. The error is a gRPC status error, as the same call over gRPC would
// have returned: the plugin's own (status frame), codes.Canceled or
// DeadlineExceeded when ctx ended, codes.Unavailable when the plane failed.
// After a transport failure or a ctx that ended mid-call the plane is
// closed for good (the stream may be out of step with the plugin; the call
// may or may not have run, so an Unavailable caller treats the plugin as
// lost); the client's next call opens a fresh plane (planeOpener). Corked
// calls go first, in the same write.
func (d *dataPlane) call(ctx context.Context, inst uint16, m method, req, resp proto.Message) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	calls, err := d.send(ctx, []outFrame{{inst: inst, m: m, req: req, resp: resp}})
	if err != nil {
		return err
	}
	return d.await(ctx, calls[0])
}

// outFrame is one request to send.
type outFrame struct {
	inst  uint16
	m     method
	flags byte
	req   proto.Message
	resp  proto.Message
}

// send writes the corked calls and then fs in one write, and returns the
// pending calls of fs, in order. An encoding error writes nothing.
func (d *dataPlane) send(ctx context.Context, fs []outFrame) ([]*pending, error) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.qmu.Lock()
	if d.broken != nil {
		d.qmu.Unlock()
		return nil, d.closedErr()
	}
	b := append(d.buf[:0], d.corkedOut...)
	calls := make([]*pending, len(fs))
	for i, f := range fs {
		var err error
		if b, err = d.appendRequest(b, ctx, f); err != nil {
			d.qmu.Unlock()
			d.buf = b[:0]
			return nil, err
		}
		calls[i] = &pending{ctx: ctx, resp: f.resp}
	}
	d.buf = b
	d.queue = append(append(d.queue, d.corked...), calls...)
	d.corked, d.corkedOut = d.corked[:0], d.corkedOut[:0]
	d.qmu.Unlock()
	d.write(ctx, b)
	return calls, nil
}

// write writes b, bounded by ctx; a failure breaks the plane (a frame cut
// short leaves the stream out of step). A ctx that ends once b is out
// changes nothing: the answers are read under their callers' ctx. Called
// with wmu held, not qmu.
func (d *dataPlane) write(ctx context.Context, b []byte) {
	if dl, ok := ctx.Deadline(); ok {
		d.pc.setWriteDeadline(dl)
		defer d.pc.setWriteDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { d.pc.setWriteDeadline(aLongTimeAgo) })
	err := d.pc.write(b)
	stop()
	if err != nil {
		d.qmu.Lock()
		d.breakLocked(err)
		d.qmu.Unlock()
	}
}

// cork queues req as method m to instance inst without writing it: it goes
// with the next call on this plane, or when its answer is waited for
// (finish). The end of a step, corked, rides with the first call of the
// next step: the plugin wakes once for both.
func (d *dataPlane) cork(ctx context.Context, inst uint16, m method, req, resp proto.Message) *pending {
	d.qmu.Lock()
	defer d.qmu.Unlock()
	c := &pending{ctx: ctx, resp: resp}
	if d.broken != nil {
		c.fail(d.closedErr())
		return c
	}
	b, err := d.appendRequest(d.corkedOut, ctx, outFrame{inst: inst, m: m, req: req})
	if err != nil {
		c.fail(err)
		return c
	}
	d.corkedOut = b
	d.corked = append(d.corked, c)
	return c
}

// finish returns c's answer, writing the corked calls now if no call has
// taken them yet.
func (d *dataPlane) finish(c *pending) error {
	d.flush(c.ctx)
	return d.await(c.ctx, c)
}

// flush writes the corked calls, if any, and reads their answers: a call
// that does not travel on the plane (gRPC) must find them applied.
func (d *dataPlane) flush(ctx context.Context) {
	d.wmu.Lock()
	d.qmu.Lock()
	var last *pending
	var b []byte
	if n := len(d.corked); n > 0 && d.broken == nil {
		last = d.corked[n-1]
		b = append(d.buf[:0], d.corkedOut...)
		d.buf = b
		d.queue = append(d.queue, d.corked...)
		d.corked, d.corkedOut = d.corked[:0], d.corkedOut[:0]
	}
	d.qmu.Unlock()
	if last != nil {
		d.write(ctx, b)
	}
	d.wmu.Unlock()
	if last != nil {
		_ = d.await(ctx, last)
	}
}

// appendRequest appends the request frame of f, with ctx's deadline, to b.
func (d *dataPlane) appendRequest(b []byte, ctx context.Context, f outFrame) ([]byte, error) {
	at := len(b)
	b = append(b, make([]byte, frameHeader)...)
	b[at+4] = byte(f.m)
	if d.instanced {
		binary.LittleEndian.PutUint16(b[at+5:], f.inst)
		b[at+7] = f.flags
	} else if f.inst != 0 || f.flags != 0 {
		return b[:at], status.Errorf(codes.Internal, "data plane version 1 carries no instance %d or flags %#x", f.inst, f.flags)
	}
	if dl, ok := ctx.Deadline(); ok {
		binary.LittleEndian.PutUint64(b[at+8:], uint64(dl.UnixNano()))
	}
	b, err := proto.MarshalOptions{}.MarshalAppend(b, f.req)
	if err != nil {
		return b[:at], status.Errorf(codes.Internal, "data plane: encode request: %v", err)
	}
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-frameHeader))
	return b, nil
}

// await returns c's answer: it reads answers, in order, until c's has come
// (another caller may read it first). ctx bounds the reading; when it ends
// mid-read the plane is closed for good, as is the call's stream.
func (d *dataPlane) await(ctx context.Context, c *pending) error {
	if c.done.Load() {
		return c.err
	}
	d.rmu.Lock()
	defer d.rmu.Unlock()
	for !c.done.Load() {
		if err := d.readOne(ctx); err != nil {
			if cerr := ctxErr(ctx); cerr != nil {
				// Our deadline on the socket can fire before ctx's own timer.
				return status.FromContextError(cerr).Err()
			}
			break
		}
	}
	return c.err
}

// readOne reads the next answer into the oldest written call. A failure
// breaks the plane. Called with rmu held. The call is taken off the queue
// under qmu, which no write holds, and the answer read without it.
func (d *dataPlane) readOne(ctx context.Context) error {
	d.qmu.Lock()
	if len(d.queue) == 0 {
		err := errors.New("waiting for an answer to no call")
		d.breakLocked(err)
		d.qmu.Unlock()
		return err
	}
	c := d.queue[0]
	d.queue = d.queue[1:]
	d.qmu.Unlock()

	dl, hasDL := ctx.Deadline()
	if hasDL {
		d.pc.setReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { d.pc.setReadDeadline(aLongTimeAgo) })
	body, st, err := d.readAnswer()
	stop() // an answer read whole leaves the stream in step, ctx or not
	if hasDL {
		d.pc.setReadDeadline(time.Time{})
	}
	if err != nil {
		d.qmu.Lock()
		d.breakLocked(err)
		c.fail(d.closedErr())
		d.qmu.Unlock()
		return err
	}
	if c.resp != nil || st == frameErr {
		c.err = decodeAnswer(body, st, c.resp)
	}
	c.done.Store(true)
	return nil
}

// readAnswer reads one answer frame, returning its message bytes (valid
// until the next read) and status byte.
func (d *dataPlane) readAnswer() ([]byte, byte, error) {
	hdr, body, err := d.pc.readFrame()
	if err != nil {
		return nil, 0, err
	}
	if s := hdr[4]; s != frameOK && s != frameErr {
		return nil, 0, fmt.Errorf("response status byte %d is not 0 or 1", s)
	}
	return body, hdr[4], nil
}

// decodeAnswer decodes an answer's message into resp, or the status it
// carries into an error.
func decodeAnswer(body []byte, st byte, resp proto.Message) error {
	if st == frameErr {
		sp := new(spb.Status)
		if err := proto.Unmarshal(body, sp); err != nil {
			return status.Errorf(codes.Internal, "data plane: undecodable error status: %v", err)
		}
		return status.ErrorProto(sp)
	}
	if err := proto.Unmarshal(body, resp); err != nil {
		return status.Errorf(codes.Internal, "data plane: undecodable response: %v", err)
	}
	return nil
}

// planeOpener keeps a client's data plane: it opens one on first use, and
// a fresh one after the last was closed (a call whose ctx ended mid-call
// leaves the stream out of step, so it closes the plane). After a failed or
// refused open, or for a GRPCOnly client, get returns nil for good and
// every call goes over gRPC.
type planeOpener struct {
	mu      sync.Mutex
	plane   *dataPlane
	off     bool
	version uint32 // the data plane version to ask for
}

type openFunc func(ctx context.Context, req *kvxpb.DataPlaneRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[kvxpb.DataPlane], error)

func (o *planeOpener) get(open openFunc) *dataPlane {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.plane != nil && !o.plane.isShut() {
		return o.plane
	}
	o.plane = nil
	if o.off {
		return nil
	}
	// The stream lives as long as the plane; the open itself is bounded.
	life, end := context.WithCancel(context.Background())
	slow := time.AfterFunc(10*time.Second, end)
	plane, stream, err := openPlane(life, open, o.version)
	if status.Code(err) == codes.Unimplemented && o.version > 2 {
		// A plugin from before shared memory, or one built for another
		// system: frames on the socket, as version 2.
		o.version = 2
		plane, stream, err = openPlane(life, open, o.version)
	}
	if !slow.Stop() || err != nil {
		end()
		if plane != nil {
			plane.shut(errors.New("data plane open timed out"))
		}
		o.off = true // UNIMPLEMENTED from an older plugin, or no socket: stay on gRPC
		return nil
	}
	o.plane = plane
	go func() {
		// Recv returns only when the stream ends: the plugin closed the
		// plane, or the connection or the process went.
		_, err := stream.Recv()
		if err == nil {
			err = errors.New("the plugin sent a second data plane message")
		}
		plane.shut(fmt.Errorf("data plane stream ended: %w", err))
		end()
	}()
	return plane
}

func openPlane(ctx context.Context, open openFunc, version uint32) (*dataPlane, grpc.ServerStreamingClient[kvxpb.DataPlane], error) {
	stream, err := open(ctx, &kvxpb.DataPlaneRequest{Version: version}, callOpts...)
	if err != nil {
		return nil, nil, err
	}
	dp, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	if dp.GetVersion() != version {
		return nil, nil, fmt.Errorf("asked for data plane version %d, the plugin opened %d", version, dp.GetVersion())
	}
	plane, err := dialDataPlane(ctx, dp)
	return plane, stream, err
}

// viaPlane sends one call to instance inst over plane p, or over gRPC when
// p is nil.
func viaPlane[Req proto.Message, Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, p *dataPlane, inst uint16, m method, in Req, overGRPC func(context.Context, Req, ...grpc.CallOption) (PResp, error), opts []grpc.CallOption) (PResp, error) {
	if p == nil {
		return overGRPC(ctx, in, opts...)
	}
	out := PResp(new(Resp))
	if err := p.call(ctx, inst, m, in, out); err != nil {
		return nil, err
	}
	return out, nil
}

// managerRPC is the host's CacheManager stub of one instance: the per-step
// calls go over the data plane when the plugin offers one, everything else
// over gRPC. The instances of one process share the opener, so their calls
// travel on one plane.
type managerRPC struct {
	kvxpb.CacheManagerClient
	opener *planeOpener
	inst   uint16
}

func (r *managerRPC) plane(context.Context) *dataPlane {
	return r.opener.get(r.CacheManagerClient.OpenDataPlane)
}

// The control-plane calls travel on gRPC: corked calls go first.

func (r *managerRPC) Configure(ctx context.Context, in *kvxpb.ManagerConfig, opts ...grpc.CallOption) (*kvxpb.Layout, error) {
	r.flush(ctx)
	return r.CacheManagerClient.Configure(ctx, in, opts...)
}

func (r *managerRPC) Stats(ctx context.Context, in *kvxpb.StatsRequest, opts ...grpc.CallOption) (*kvxpb.ManagerStats, error) {
	r.flush(ctx)
	return r.CacheManagerClient.Stats(ctx, in, opts...)
}

func (r *managerRPC) Inspect(ctx context.Context, in *kvxpb.InspectOptions, opts ...grpc.CallOption) (*kvxpb.Snapshot, error) {
	r.flush(ctx)
	return r.CacheManagerClient.Inspect(ctx, in, opts...)
}

// flush sends the corked calls of an open plane; it opens none.
func (r *managerRPC) flush(ctx context.Context) {
	r.opener.mu.Lock()
	p := r.opener.plane
	r.opener.mu.Unlock()
	if p != nil {
		p.flush(ctx)
	}
}

func (r *managerRPC) Lookup(ctx context.Context, in *kvxpb.LookupRequest, opts ...grpc.CallOption) (*kvxpb.LookupResponse, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mLookup, in, r.CacheManagerClient.Lookup, opts)
}

func (r *managerRPC) Reserve(ctx context.Context, in *kvxpb.ReserveRequest, opts ...grpc.CallOption) (*kvxpb.ReserveResponse, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mReserve, in, r.CacheManagerClient.Reserve, opts)
}

func (r *managerRPC) Unreserve(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.Empty, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mUnreserve, in, r.CacheManagerClient.Unreserve, opts)
}

func (r *managerRPC) Commit(ctx context.Context, in *kvxpb.CommitRequest, opts ...grpc.CallOption) (*kvxpb.CommitResult, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mCommit, in, r.CacheManagerClient.Commit, opts)
}

func (r *managerRPC) Suspend(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.MoveResult, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mSuspend, in, r.CacheManagerClient.Suspend, opts)
}

func (r *managerRPC) Resume(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.MoveResult, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mResume, in, r.CacheManagerClient.Resume, opts)
}

func (r *managerRPC) Release(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.Empty, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mRelease, in, r.CacheManagerClient.Release, opts)
}

func (r *managerRPC) EndStep(ctx context.Context, in *kvxpb.EndStepRequest, opts ...grpc.CallOption) (*kvxpb.EndStepResult, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mEndStep, in, r.CacheManagerClient.EndStep, opts)
}

// handlers are the framed calls a manager server answers.
func (s *managerServer) handlers() map[method]handler {
	s.once.Do(func() { s.framed = s.makeHandlers() })
	return s.framed
}

func (s *managerServer) makeHandlers() map[method]handler {
	return map[method]handler{
		mLookup:    handle(s.Lookup),
		mReserve:   handle(s.Reserve),
		mUnreserve: handle(s.Unreserve),
		mCommit:    handle(s.Commit),
		mSuspend:   handle(s.Suspend),
		mResume:    handle(s.Resume),
		mRelease:   handle(s.Release),
		mEndStep:   handle(s.EndStep),
	}
}

// OpenDataPlane implements the CacheManager service.
func (s *managerServer) OpenDataPlane(req *kvxpb.DataPlaneRequest, stream grpc.ServerStreamingServer[kvxpb.DataPlane]) error {
	return serveDataPlane(req, stream, s.routes())
}

// routes returns the handlers of the instances that the plane serves: the
// process's instances (registerManagers), or s alone as instance 0.
func (s *managerServer) routes() route {
	if s.route != nil {
		return s.route
	}
	return sole(s.handlers)
}

// sole routes the frames of a process that serves one instance.
func sole(handlers func() map[method]handler) route {
	return func(inst uint16) (map[method]handler, error) {
		if inst != 0 {
			return nil, status.Errorf(codes.InvalidArgument, "data plane: instance %d: this plugin process serves one instance", inst)
		}
		return handlers(), nil
	}
}

// workerRPC is managerRPC for a worker.
type workerRPC struct {
	kvxpb.WorkerClient
	opener *planeOpener
	inst   uint16
}

func (r *workerRPC) plane(context.Context) *dataPlane {
	return r.opener.get(r.WorkerClient.OpenDataPlane)
}

func (r *workerRPC) Forward(ctx context.Context, in *kvxpb.Batch, opts ...grpc.CallOption) (*kvxpb.Result, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mForward, in, r.WorkerClient.Forward, opts)
}

func (r *workerRPC) CopyBlocks(ctx context.Context, in *kvxpb.CopyBlocksRequest, opts ...grpc.CallOption) (*kvxpb.Empty, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, mCopyBlocks, in, r.WorkerClient.CopyBlocks, opts)
}

// OpenDataPlane implements the Worker service.
func (s *workerServer) OpenDataPlane(req *kvxpb.DataPlaneRequest, stream grpc.ServerStreamingServer[kvxpb.DataPlane]) error {
	return serveDataPlane(req, stream, s.routes())
}

// handlers are the framed calls a worker server answers.
func (s *workerServer) handlers() map[method]handler {
	s.once.Do(func() {
		s.framed = map[method]handler{
			mForward:    s.forwardFramed,
			mCopyBlocks: handle(s.CopyBlocks),
		}
	})
	return s.framed
}

// forwardFramed is Forward on the data plane, in a chain or not: a
// flagTake frame's batch gets the activations the previous frame kept,
// and a flagKeep frame keeps its result's for the next (ForwardChain).
func (s *workerServer) forwardFramed(ctx context.Context, b []byte, ch *chain) (proto.Message, error) {
	req := new(kvxpb.Batch)
	if err := proto.Unmarshal(b, req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "data plane: undecodable request: %v", err)
	}
	if ch.flags&flagTake != 0 {
		if !ch.ok {
			return nil, status.Error(codes.Aborted, "data plane: not run: the previous stage of the chain failed")
		}
		req.Hidden = ch.kept
	}
	ch.kept, ch.ok = nil, false
	resp, err := s.Forward(ctx, req)
	if err == nil && ch.flags&flagKeep != 0 {
		ch.kept, ch.ok = resp.GetHidden(), true
		resp.Hidden = nil
	}
	return resp, err
}

// routes: see managerServer.routes.
func (s *workerServer) routes() route {
	if s.route != nil {
		return s.route
	}
	return sole(s.handlers)
}
