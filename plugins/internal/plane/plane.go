package plane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
)

// Plane is the host end of a data plane. It is safe for concurrent use
// and pipelined: a call writes its frame and then waits for its answer, so
// calls of several goroutines (the pipeline stages' instances of one plugin
// process) are in the plugin together and it serves them in one wake-up.
// Answers come in the order of the frames; whichever caller is waiting
// reads them, each into its own call's message.
type Plane struct {
	conn *net.UnixConn
	pc   *planeConn

	// wmu is held across a write: frames go out in the order of queue.
	wmu sync.Mutex
	buf []byte // the frames being written (wmu)

	// qmu guards the calls' state. It is never held across a read or a
	// write, so a writer blocked on a full socket never keeps the reader
	// from draining answers (nor the plugin from finishing its write).
	qmu       sync.Mutex
	corkedOut []byte     // the corked calls' frames, not yet written
	corked    []*Pending // in corkedOut's order
	queue     []*Pending // written (or being written), in order; their answers not yet read
	broken    error      // set on the first transport failure; the plane is closed then

	// rmu is held by the caller that reads answers.
	rmu sync.Mutex
}

// Pending is one call on the plane: written (or corked), then answered.
// Its fields are set once before done is: by the reader that took it off
// the queue, or under qmu when the plane breaks.
type Pending struct {
	ctx  context.Context
	resp proto.Message // nil: the answer is read and dropped
	err  error
	done atomic.Bool
}

// Dial connects to the plane a plugin opened and presents its token.
func Dial(ctx context.Context, dp *kvxpb.DataPlane) (*Plane, error) {
	v := dp.GetVersion()
	if dp.GetNetwork() != "unix" || v != Version {
		return nil, fmt.Errorf("data plane %s version %d is not spoken here (unix, version %d)", dp.GetNetwork(), v, Version)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", dp.GetAddress())
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	var shm *shmLink
	if ShmSupported {
		shm, err = offerShm(conn, dp.GetToken())
	} else {
		_, err = conn.Write(dp.GetToken())
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	plane, err := newPlane(conn)
	if err != nil {
		if shm != nil {
			shm.close()
		}
		return nil, err
	}
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

func newPlane(conn *net.UnixConn) (*Plane, error) {
	pc, err := newPlaneConn(conn)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	pc.spin = replySpin
	return &Plane{conn: conn, pc: pc}, nil
}

// SharedMemory reports whether the frames travel in shared memory (data
// plane version 3).
func (d *Plane) SharedMemory() bool { return d.pc.shm != nil }

// isShut reports whether the plane was closed.
func (d *Plane) isShut() bool {
	d.qmu.Lock()
	defer d.qmu.Unlock()
	return d.broken != nil
}

// Shut closes the plane for good with cause; calls in flight fail.
func (d *Plane) Shut(cause error) {
	_ = d.pc.close() // first, so that a blocked read or write returns
	d.qmu.Lock()
	defer d.qmu.Unlock()
	d.breakLocked(cause)
}

// breakLocked marks the plane broken with cause (the first cause stays),
// closes it and fails every call not yet answered. Called with qmu held.
func (d *Plane) breakLocked(cause error) {
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

func (d *Plane) closedErr() error {
	return status.Errorf(codes.Unavailable, "data plane closed after an earlier failure: %v", d.broken)
}

func (p *Pending) fail(err error) {
	if !p.done.Load() {
		p.err = err
		p.done.Store(true)
	}
}

// aLongTimeAgo is a deadline that has passed: setting it unblocks a pending
// read or write at once.
var aLongTimeAgo = time.Unix(1, 0)

// Call sends req as method m to instance inst and decodes the answer into
// resp. The error is a gRPC status error, as the same call over gRPC would
// have returned: the plugin's own (status frame), codes.Canceled or
// DeadlineExceeded when ctx ended, codes.Unavailable when the plane failed.
// After a transport failure or a ctx that ended mid-call the plane is
// closed for good (the stream may be out of step with the plugin; the call
// may or may not have run, so an Unavailable caller treats the plugin as
// lost); the client's next call opens a fresh plane (Opener). Corked
// calls go first, in the same write.
func (d *Plane) Call(ctx context.Context, inst uint16, m Method, req, resp proto.Message) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	calls, err := d.Send(ctx, []Frame{{Inst: inst, M: m, Req: req, Resp: resp}})
	if err != nil {
		return err
	}
	return d.Await(ctx, calls[0])
}

// Frame is one request to send.
type Frame struct {
	Inst  uint16
	M     Method
	Flags byte // FlagKeep, FlagTake
	Req   proto.Message
	Resp  proto.Message // nil: the answer is read and dropped
}

// Send writes the corked calls and then fs in one write, and returns the
// pending calls of fs, in order. An encoding error writes nothing.
func (d *Plane) Send(ctx context.Context, fs []Frame) ([]*Pending, error) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.qmu.Lock()
	if d.broken != nil {
		d.qmu.Unlock()
		return nil, d.closedErr()
	}
	b := append(d.buf[:0], d.corkedOut...)
	calls := make([]*Pending, len(fs))
	for i, f := range fs {
		var err error
		if b, err = d.appendRequest(b, ctx, f); err != nil {
			d.qmu.Unlock()
			d.buf = b[:0]
			return nil, err
		}
		calls[i] = &Pending{ctx: ctx, resp: f.Resp}
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
func (d *Plane) write(ctx context.Context, b []byte) {
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

// Cork queues req as method m to instance inst without writing it: it goes
// with the next call on this plane, or when its answer is waited for
// (Finish). The end of a step, corked, rides with the first call of the
// next step: the plugin wakes once for both.
func (d *Plane) Cork(ctx context.Context, inst uint16, m Method, req, resp proto.Message) *Pending {
	d.qmu.Lock()
	defer d.qmu.Unlock()
	c := &Pending{ctx: ctx, resp: resp}
	if d.broken != nil {
		c.fail(d.closedErr())
		return c
	}
	b, err := d.appendRequest(d.corkedOut, ctx, Frame{Inst: inst, M: m, Req: req})
	if err != nil {
		c.fail(err)
		return c
	}
	d.corkedOut = b
	d.corked = append(d.corked, c)
	return c
}

// Finish returns c's answer, writing the corked calls now if no call has
// taken them yet.
func (d *Plane) Finish(c *Pending) error {
	d.Flush(c.ctx)
	return d.Await(c.ctx, c)
}

// Flush writes the corked calls, if any, and reads their answers: a call
// that does not travel on the plane (gRPC) must find them applied.
func (d *Plane) Flush(ctx context.Context) {
	d.wmu.Lock()
	d.qmu.Lock()
	var last *Pending
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
		_ = d.Await(ctx, last)
	}
}

// Await returns c's answer: it reads answers, in order, until c's has come
// (another caller may read it first). ctx bounds the reading; when it ends
// mid-read the plane is closed for good, as is the call's stream.
func (d *Plane) Await(ctx context.Context, c *Pending) error {
	if c.done.Load() {
		return c.err
	}
	d.rmu.Lock()
	defer d.rmu.Unlock()
	for !c.done.Load() {
		if err := d.readOne(ctx); err != nil {
			if cerr := CtxErr(ctx); cerr != nil {
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
func (d *Plane) readOne(ctx context.Context) error {
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
func (d *Plane) readAnswer() ([]byte, byte, error) {
	hdr, body, err := d.pc.readFrame()
	if err != nil {
		return nil, 0, err
	}
	if s := hdr[4]; s != frameOK && s != frameErr {
		return nil, 0, fmt.Errorf("response status byte %d is not 0 or 1", s)
	}
	return body, hdr[4], nil
}

// Opener keeps a client's data plane: it opens one on first use, and a
// fresh one after the last was closed (a call whose ctx ended mid-call
// leaves the stream out of step, so it closes the plane). After a failed or
// refused open, or for a client that keeps off the plane (off), Get returns
// nil for good and every call goes over gRPC. The instance clients of one
// plugin process share one Opener, so their calls travel on one plane.
type Opener struct {
	mu    sync.Mutex
	plane *Plane
	off   bool
}

// NewOpener returns an opener of data plane Version; with off it never
// opens one.
func NewOpener(off bool) *Opener {
	return &Opener{off: off}
}

// Current returns the plane that is open, nil when none is; it opens none.
func (o *Opener) Current() *Plane {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.plane
}

// Off reports whether the opener keeps every call on gRPC for good.
func (o *Opener) Off() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.off
}

// OpenFunc opens the stream of a data plane: the OpenDataPlane call of a
// plugin's service, with the caller's call options.
type OpenFunc func(ctx context.Context, req *kvxpb.DataPlaneRequest) (grpc.ServerStreamingClient[kvxpb.DataPlane], error)

func (o *Opener) Get(open OpenFunc) *Plane {
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
	plane, stream, err := openPlane(life, open, Version)
	if !slow.Stop() || err != nil {
		end()
		if plane != nil {
			plane.Shut(errors.New("data plane open timed out"))
		}
		o.off = true // UNIMPLEMENTED (a plugin without a data plane), or no socket: stay on gRPC
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
		plane.Shut(fmt.Errorf("data plane stream ended: %w", err))
		end()
	}()
	return plane
}

func openPlane(ctx context.Context, open OpenFunc, version uint32) (*Plane, grpc.ServerStreamingClient[kvxpb.DataPlane], error) {
	stream, err := open(ctx, &kvxpb.DataPlaneRequest{Version: version})
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
	plane, err := Dial(ctx, dp)
	return plane, stream, err
}

// CtxErr is ctx.Err(), or context.DeadlineExceeded once ctx's deadline has
// passed even if its timer has not fired yet: the plugin's copy of the
// deadline (never earlier than ours) can fire first on a busy machine.
func CtxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}
