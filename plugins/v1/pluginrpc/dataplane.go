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

// dataPlaneVersion is the frame format this package speaks.
const dataPlaneVersion = 1

const (
	frameHeader = 16 // u32 length, u8 method or status, 3 zero bytes, i64 deadline
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
type handler func(ctx context.Context, b []byte) (proto.Message, error)

// handle adapts one server method to a handler.
func handle[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](f func(context.Context, PReq) (Resp, error)) handler {
	return func(ctx context.Context, b []byte) (proto.Message, error) {
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "data plane: undecodable request: %v", err)
		}
		return f(ctx, req)
	}
}

// serveDataPlane serves one OpenDataPlane call: it listens on a fresh socket
// in a private directory, sends where to connect, serves the first
// connection that presents the token with handlers, and returns when the
// plane or the RPC's stream ends, whichever comes first. The socket and its
// directory are removed once a connection is accepted (or none came within
// acceptWait). Framed calls run under the stream's ctx, so they end with the
// gRPC connection like any RPC.
func serveDataPlane(req *kvxpb.DataPlaneRequest, stream grpc.ServerStreamingServer[kvxpb.DataPlane], handlers map[method]handler) error {
	if v := req.GetVersion(); v != dataPlaneVersion {
		return status.Errorf(codes.Unimplemented, "data plane version %d is not served (this plugin speaks %d)", v, dataPlaneVersion)
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
	if err := stream.Send(&kvxpb.DataPlane{Network: "unix", Address: path, Token: token, Version: dataPlaneVersion}); err != nil {
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
	defer c.Close()
	stopServe := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stopServe()
	serveFrames(ctx, c, token, handlers)
	return nil
}

// serveFrames answers framed calls on c, one at a time, until c fails or
// sends something that is not a frame. The handlers take the server's gate
// themselves, so framed and gRPC calls never overlap. A call that runs past
// watchAfter is watched: the host closing the plane (it does when the
// caller's ctx ends mid-call) cancels it, as gRPC would. Shorter calls are
// not worth a second goroutine.
func serveFrames(ctx context.Context, c *net.UnixConn, token []byte, handlers map[method]handler) {
	pc, err := newPlaneConn(c)
	if err != nil {
		return
	}
	got, err := pc.next(len(token))
	if err != nil || subtle.ConstantTimeCompare(got, token) != 1 {
		return
	}
	var out []byte
	for {
		hdr, body, err := pc.readFrame()
		if err != nil {
			return
		}
		cctx, cancel := context.WithCancel(ctx)
		if dl := int64(binary.LittleEndian.Uint64(hdr[8:])); dl != 0 {
			cctx, cancel = context.WithDeadline(ctx, time.Unix(0, dl))
		}
		watch := watchHangUp(pc, cancel)
		var resp proto.Message
		if h := handlers[method(hdr[4])]; h != nil {
			resp, err = h(cctx, body)
		} else {
			err = status.Errorf(codes.Unimplemented, "data plane: method %d is not served", hdr[4])
		}
		hungUp := watch()
		cancel()
		if hungUp {
			return
		}
		out, err = appendResponse(out[:0], resp, err)
		if err != nil {
			return
		}
		if err := pc.write(out); err != nil {
			return
		}
	}
}

// watchAfter is how long a framed call runs before the plugin watches for
// the host hanging up on it.
const watchAfter = time.Millisecond

// watchHangUp starts watching pc for the host hanging up once the call has
// run for watchAfter, calling cancel then. The returned stop ends the watch
// (waiting for the watcher, which holds pc's read side) and reports whether
// the host hung up.
func watchHangUp(pc *planeConn, cancel context.CancelFunc) (stop func() bool) {
	var hungUp atomic.Bool
	done := make(chan struct{})
	t := time.AfterFunc(watchAfter, func() {
		defer close(done)
		if err := pc.waitHangUp(); !errors.Is(err, os.ErrDeadlineExceeded) {
			// EOF, a reset, or data out of turn: the call is abandoned.
			hungUp.Store(true)
			cancel()
		}
	})
	return func() bool {
		if t.Stop() {
			return false
		}
		_ = pc.c.SetReadDeadline(aLongTimeAgo)
		<-done
		_ = pc.c.SetReadDeadline(time.Time{})
		return hungUp.Load()
	}
}

// appendResponse appends the response frame of (resp, callErr) to b.
func appendResponse(b []byte, resp proto.Message, callErr error) ([]byte, error) {
	b = append(b, make([]byte, frameHeader)...)
	var err error
	if callErr != nil {
		b[4] = frameErr
		b, err = proto.MarshalOptions{}.MarshalAppend(b, status.Convert(callErr).Proto())
	} else {
		b, err = proto.MarshalOptions{}.MarshalAppend(b, resp)
	}
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)-frameHeader))
	return b, nil
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// dataPlane is the host end of a data plane. It is safe for concurrent use;
// calls are sent one at a time.
type dataPlane struct {
	mu        sync.Mutex
	conn      *net.UnixConn
	pc        *planeConn
	buf       []byte
	corkedOut []byte        // the corked calls' frames, not yet written
	corked    []*corkedCall // in corkedOut's order
	broken    error         // set on the first transport failure; the plane is closed then
}

// dialDataPlane connects to the plane a plugin opened and presents its token.
func dialDataPlane(ctx context.Context, dp *kvxpb.DataPlane) (*dataPlane, error) {
	if dp.GetNetwork() != "unix" || dp.GetVersion() != dataPlaneVersion {
		return nil, fmt.Errorf("data plane %s version %d is not spoken here (unix, %d)", dp.GetNetwork(), dp.GetVersion(), dataPlaneVersion)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", dp.GetAddress())
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	if _, err := conn.Write(dp.GetToken()); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return newDataPlane(conn)
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
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.broken != nil
}

// shut closes the plane for good with cause; a call in flight fails.
func (d *dataPlane) shut(cause error) {
	_ = d.conn.Close() // first, so that a call holding mu returns
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.broken == nil {
		d.broken = cause
	}
}

// aLongTimeAgo is a deadline that has passed: setting it unblocks a pending
// read or write at once.
var aLongTimeAgo = time.Unix(1, 0)

// call sends req as method m and decodes the answer into resp. The error is
// a gRPC status error, as the same call over gRPC would have returned: the
// plugin's own (status frame), codes.Canceled or DeadlineExceeded when ctx
// ended, codes.Unavailable when the plane failed. After a transport failure
// or a ctx that ended mid-call the plane is closed for good (the stream may
// be out of step with the plugin; the call may or may not have run, so an
// Unavailable caller treats the plugin as lost); the client's next call
// opens a fresh plane (planeOpener). Corked calls go first, in the same
// write, and get their answers first.
func (d *dataPlane) call(ctx context.Context, m method, req, resp proto.Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.broken != nil {
		return status.Errorf(codes.Unavailable, "data plane closed after an earlier failure: %v", d.broken)
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	b, err := appendRequest(append(d.buf[:0], d.corkedOut...), ctx, m, req)
	if err != nil {
		return err
	}
	d.corkedOut = d.corkedOut[:0]
	d.buf = b
	return d.exchange(ctx, b, resp)
}

// corkedCall is a call written to the plane with the next call instead of
// on its own (cork): its answer comes with that call's.
type corkedCall struct {
	ctx  context.Context
	resp proto.Message
	err  error
	done bool
}

// cork queues req as method m without writing it: it goes with the next
// call on this plane, or when its answer is waited for (finish). The end of
// a step, corked, rides with the first call of the next step: the plugin
// wakes once for both.
func (d *dataPlane) cork(ctx context.Context, m method, req, resp proto.Message) *corkedCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := &corkedCall{ctx: ctx, resp: resp}
	if d.broken != nil {
		c.err, c.done = status.Errorf(codes.Unavailable, "data plane closed after an earlier failure: %v", d.broken), true
		return c
	}
	b, err := appendRequest(d.corkedOut, ctx, m, req)
	if err != nil {
		c.err, c.done = err, true
		return c
	}
	d.corkedOut = b
	d.corked = append(d.corked, c)
	return c
}

// finish returns c's answer, writing the corked calls now if no call has
// taken them yet.
func (d *dataPlane) finish(c *corkedCall) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !c.done {
		d.flushLocked(c.ctx)
	}
	return c.err
}

// flush writes the corked calls, if any, and reads their answers: a call
// that does not travel on the plane (gRPC) must find them applied.
func (d *dataPlane) flush(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.flushLocked(ctx)
}

func (d *dataPlane) flushLocked(ctx context.Context) {
	if len(d.corked) == 0 {
		return
	}
	if d.broken == nil {
		b := append(d.buf[:0], d.corkedOut...)
		d.corkedOut = d.corkedOut[:0]
		d.buf = b
		_ = d.exchange(ctx, b, nil)
	}
	for _, c := range d.corked { // the plane broke before they were written
		c.err, c.done = status.Errorf(codes.Unavailable, "data plane closed after an earlier failure: %v", d.broken), true
	}
	d.corked, d.corkedOut = d.corked[:0], d.corkedOut[:0]
}

// appendRequest appends the request frame of req as method m, with ctx's
// deadline, to b.
func appendRequest(b []byte, ctx context.Context, m method, req proto.Message) ([]byte, error) {
	at := len(b)
	b = append(b, make([]byte, frameHeader)...)
	b[at+4] = byte(m)
	if dl, ok := ctx.Deadline(); ok {
		binary.LittleEndian.PutUint64(b[at+8:], uint64(dl.UnixNano()))
	}
	b, err := proto.MarshalOptions{}.MarshalAppend(b, req)
	if err != nil {
		return b[:at], status.Errorf(codes.Internal, "data plane: encode request: %v", err)
	}
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-frameHeader))
	return b, nil
}

// exchange writes the frames in b and reads the answers: the corked calls'
// first, then, when resp is not nil, the caller's. Called with mu held.
func (d *dataPlane) exchange(ctx context.Context, b []byte, resp proto.Message) error {
	dl, hasDL := ctx.Deadline()
	if hasDL {
		_ = d.conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = d.conn.SetDeadline(aLongTimeAgo) })
	err := d.pc.write(b)
	corked := d.corked
	d.corked = d.corked[:0]
	for _, c := range corked {
		if err != nil {
			break
		}
		var body []byte
		var st byte
		if body, st, err = d.readAnswer(); err == nil {
			c.err, c.done = decodeAnswer(body, st, c.resp), true
		}
	}
	var callErr error
	if err == nil && resp != nil {
		var body []byte
		var st byte
		if body, st, err = d.readAnswer(); err == nil {
			callErr = decodeAnswer(body, st, resp)
		}
	}
	if !stop() || err != nil {
		// ctx ended during the call, or the plane failed: the stream may be
		// out of step with the plugin, so it is closed for good.
		if err == nil {
			err = context.Cause(ctx)
		}
		d.broken = err
		_ = d.conn.Close()
		err = status.Errorf(codes.Unavailable, "data plane: %v", err)
		if cerr := ctxErr(ctx); cerr != nil {
			// Our deadline on the socket can fire before ctx's own timer.
			err = status.FromContextError(cerr).Err()
		}
		for _, c := range corked {
			if !c.done {
				c.err, c.done = err, true
			}
		}
		return err
	}
	if hasDL {
		_ = d.conn.SetDeadline(time.Time{})
	}
	return callErr
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
	mu    sync.Mutex
	plane *dataPlane
	off   bool
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
	plane, stream, err := openPlane(life, open)
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

func openPlane(ctx context.Context, open openFunc) (*dataPlane, grpc.ServerStreamingClient[kvxpb.DataPlane], error) {
	stream, err := open(ctx, &kvxpb.DataPlaneRequest{Version: dataPlaneVersion}, callOpts...)
	if err != nil {
		return nil, nil, err
	}
	dp, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	plane, err := dialDataPlane(ctx, dp)
	return plane, stream, err
}

// viaPlane sends one call over plane p, or over gRPC when p is nil.
func viaPlane[Req proto.Message, Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, p *dataPlane, m method, in Req, overGRPC func(context.Context, Req, ...grpc.CallOption) (PResp, error), opts []grpc.CallOption) (PResp, error) {
	if p == nil {
		return overGRPC(ctx, in, opts...)
	}
	out := PResp(new(Resp))
	if err := p.call(ctx, m, in, out); err != nil {
		return nil, err
	}
	return out, nil
}

// managerRPC is the host's CacheManager stub: the per-step calls go over
// the data plane when the plugin offers one, everything else over gRPC.
type managerRPC struct {
	kvxpb.CacheManagerClient
	opener planeOpener
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
	return viaPlane(ctx, r.plane(ctx), mLookup, in, r.CacheManagerClient.Lookup, opts)
}

func (r *managerRPC) Reserve(ctx context.Context, in *kvxpb.ReserveRequest, opts ...grpc.CallOption) (*kvxpb.ReserveResponse, error) {
	return viaPlane(ctx, r.plane(ctx), mReserve, in, r.CacheManagerClient.Reserve, opts)
}

func (r *managerRPC) Unreserve(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.Empty, error) {
	return viaPlane(ctx, r.plane(ctx), mUnreserve, in, r.CacheManagerClient.Unreserve, opts)
}

func (r *managerRPC) Commit(ctx context.Context, in *kvxpb.CommitRequest, opts ...grpc.CallOption) (*kvxpb.CommitResult, error) {
	return viaPlane(ctx, r.plane(ctx), mCommit, in, r.CacheManagerClient.Commit, opts)
}

func (r *managerRPC) Suspend(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.MoveResult, error) {
	return viaPlane(ctx, r.plane(ctx), mSuspend, in, r.CacheManagerClient.Suspend, opts)
}

func (r *managerRPC) Resume(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.MoveResult, error) {
	return viaPlane(ctx, r.plane(ctx), mResume, in, r.CacheManagerClient.Resume, opts)
}

func (r *managerRPC) Release(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.Empty, error) {
	return viaPlane(ctx, r.plane(ctx), mRelease, in, r.CacheManagerClient.Release, opts)
}

func (r *managerRPC) EndStep(ctx context.Context, in *kvxpb.EndStepRequest, opts ...grpc.CallOption) (*kvxpb.EndStepResult, error) {
	return viaPlane(ctx, r.plane(ctx), mEndStep, in, r.CacheManagerClient.EndStep, opts)
}

// managerHandlers are the framed calls a manager server answers.
func (s *managerServer) handlers() map[method]handler {
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
	return serveDataPlane(req, stream, s.handlers())
}

// workerRPC is managerRPC for a worker.
type workerRPC struct {
	kvxpb.WorkerClient
	opener planeOpener
}

func (r *workerRPC) plane(context.Context) *dataPlane {
	return r.opener.get(r.WorkerClient.OpenDataPlane)
}

func (r *workerRPC) Forward(ctx context.Context, in *kvxpb.Batch, opts ...grpc.CallOption) (*kvxpb.Result, error) {
	return viaPlane(ctx, r.plane(ctx), mForward, in, r.WorkerClient.Forward, opts)
}

func (r *workerRPC) CopyBlocks(ctx context.Context, in *kvxpb.CopyBlocksRequest, opts ...grpc.CallOption) (*kvxpb.Empty, error) {
	return viaPlane(ctx, r.plane(ctx), mCopyBlocks, in, r.WorkerClient.CopyBlocks, opts)
}

// OpenDataPlane implements the Worker service.
func (s *workerServer) OpenDataPlane(req *kvxpb.DataPlaneRequest, stream grpc.ServerStreamingServer[kvxpb.DataPlane]) error {
	return serveDataPlane(req, stream, map[method]handler{
		mForward:    handle(s.Forward),
		mCopyBlocks: handle(s.CopyBlocks),
	})
}
