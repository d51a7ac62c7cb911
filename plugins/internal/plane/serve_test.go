package plane

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
)

var ctx = context.Background()

// server serves a data plane whose instance 0 answers Release, recording
// the sequences of each call.
type server struct {
	kvxpb.UnimplementedCacheManagerServer
	mu    sync.Mutex
	calls [][]uint64
}

func (s *server) OpenDataPlane(req *kvxpb.DataPlaneRequest, stream grpc.ServerStreamingServer[kvxpb.DataPlane]) error {
	handlers := map[Method]Handler{
		Release: Handle(func(_ context.Context, in *kvxpb.Seqs) (*kvxpb.Empty, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.calls = append(s.calls, in.GetSeqs())
			return &kvxpb.Empty{}, nil
		}),
	}
	return Serve(req, stream, Sole(func() map[Method]Handler { return handlers }))
}

func (s *server) seen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

// openRaw serves s on an in-memory gRPC connection, opens a data plane of
// version v by hand and returns the DataPlane message.
func openRaw(t *testing.T, s *server, v uint32) *kvxpb.DataPlane {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	kvxpb.RegisterCacheManagerServer(gs, s)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///plane",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	sctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := kvxpb.NewCacheManagerClient(conn).OpenDataPlane(sctx, &kvxpb.DataPlaneRequest{Version: v})
	if err != nil {
		t.Fatal(err)
	}
	dp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return dp
}

// TestDataPlaneNeedsTheToken: a connection that does not present the token
// (nor, in shared memory, the memory file) is hung up on before any call
// reaches the manager; TestShmNeedsTheToken sends the memory file with a
// wrong token.
func TestDataPlaneNeedsTheToken(t *testing.T) {
	s := &server{}
	dp := openRaw(t, s, Version)
	c, err := net.Dial("unix", dp.GetAddress())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bad := make([]byte, tokenBytes)
	frame := make([]byte, frameHeader)
	frame[4] = byte(Release)
	_, _ = c.Write(append(bad, frame...))
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// Hung up on: EOF, or a reset when the bytes sent were left unread.
	if n, err := c.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after a wrong token = %d bytes, %v; want EOF or a reset", n, err)
	}
	if n := s.seen(); n != 0 {
		t.Errorf("manager saw %d calls, want none", n)
	}
	// The socket is gone once a connection was accepted: nobody else can try.
	if c2, err := net.Dial("unix", dp.GetAddress()); err == nil {
		c2.Close()
		t.Error("a second connection to the data plane socket succeeded")
	}
}

// TestDataPlaneBadFrames: an unknown method is answered UNIMPLEMENTED and
// the plane goes on; an oversized frame ends the plane.
func TestDataPlaneBadFrames(t *testing.T) {
	const v = Version
	s := &server{}
	dp := openRaw(t, s, v)
	plane, err := Dial(ctx, dp)
	if err != nil {
		t.Fatal(err)
	}
	defer plane.Shut(errors.New("test over"))
	if plane.SharedMemory() != ShmSupported {
		t.Fatalf("version %d: shared memory %v", v, plane.SharedMemory())
	}
	var out kvxpb.Empty
	err = plane.Call(ctx, 0, Method(200), &kvxpb.Seqs{}, &out)
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method: %v, want UNIMPLEMENTED", err)
	}
	if err := plane.Call(ctx, 0, Release, &kvxpb.Seqs{Seqs: []uint64{4}}, &out); err != nil {
		t.Errorf("Release after an unknown method: %v", err)
	}
	if n := s.seen(); n != 1 {
		t.Errorf("manager saw %d calls, want the Release", n)
	}
	hdr := make([]byte, frameHeader)
	binary.LittleEndian.PutUint32(hdr, MaxMessageBytes+1)
	hdr[4] = byte(Release)
	if err := plane.pc.write(hdr); err != nil {
		t.Fatal(err)
	}
	plane.pc.setReadDeadline(time.Now().Add(5 * time.Second))
	if err := plane.pc.fill(); err != io.EOF {
		t.Errorf("read after an oversized frame: %v; want EOF", err)
	}
}

// TestOneVersion: a plugin serves its system's data plane version only; a
// host asking for another is refused, and the answer says which it speaks.
func TestOneVersion(t *testing.T) {
	s := &server{}
	for _, v := range []uint32{1, 2, 3, 4} {
		if v == Version {
			continue
		}
		lis := bufconn.Listen(1 << 20)
		gs := grpc.NewServer()
		kvxpb.RegisterCacheManagerServer(gs, s)
		go func() { _ = gs.Serve(lis) }()
		conn, err := grpc.NewClient("passthrough:///plane",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		stream, err := kvxpb.NewCacheManagerClient(conn).OpenDataPlane(ctx, &kvxpb.DataPlaneRequest{Version: v})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("OpenDataPlane(version %d) = %v, want UNIMPLEMENTED (this system speaks %d)", v, err, Version)
		}
		_ = conn.Close()
		gs.Stop()
	}
}
