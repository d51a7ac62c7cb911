//go:build linux

package plane

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
)

// The fuzz targets run the framing on a socket pair (the frames of a
// shared-memory plane go through the same planeConn reads); socketPair is in
// shm_linux_test.go.

// maxFuzzFrames bounds the bytes of one fuzz input, so that the seed corpus
// runs in well under a second as a unit test.
const maxFuzzFrames = 1 << 20

// frameBytes is one request frame as appendRequest writes it, with the
// given header fields.
func frameBytes(m Method, inst uint16, flags byte, deadline int64, msg proto.Message) []byte {
	b := make([]byte, frameHeader)
	b[4] = byte(m)
	binary.LittleEndian.PutUint16(b[5:], inst)
	b[7] = flags
	binary.LittleEndian.PutUint64(b[8:], uint64(deadline))
	b, _ = proto.MarshalOptions{}.MarshalAppend(b, msg)
	binary.LittleEndian.PutUint32(b, uint32(len(b)-frameHeader))
	return b
}

// fuzzHandlers decode each method's request message as the plugin's
// handlers do, and fail a request whose message is not empty with an odd
// length (so that both answer kinds come back).
func fuzzHandlers() map[Method]Handler {
	answer := func(m proto.Message) (*kvxpb.Empty, error) {
		if n := proto.Size(m); n%2 == 1 {
			return nil, status.Errorf(codes.InvalidArgument, "message of %d bytes", n)
		}
		return &kvxpb.Empty{}, nil
	}
	return map[Method]Handler{
		Lookup: Handle(func(_ context.Context, r *kvxpb.LookupRequest) (*kvxpb.Empty, error) { return answer(r) }),
		Reserve: Handle(func(_ context.Context, r *kvxpb.ReserveRequest) (*kvxpb.Empty, error) {
			return answer(r)
		}),
		Commit:  Handle(func(_ context.Context, r *kvxpb.CommitRequest) (*kvxpb.Empty, error) { return answer(r) }),
		Release: Handle(func(_ context.Context, r *kvxpb.Seqs) (*kvxpb.Empty, error) { return answer(r) }),
		EndStep: Handle(func(_ context.Context, r *kvxpb.EndStepRequest) (*kvxpb.Empty, error) {
			return answer(r)
		}),
		Forward: Handle(func(_ context.Context, r *kvxpb.Batch) (*kvxpb.Empty, error) { return answer(r) }),
		CopyBlocks: Handle(func(_ context.Context, r *kvxpb.CopyBlocksRequest) (*kvxpb.Empty, error) {
			return answer(r)
		}),
	}
}

// FuzzServeFrames sends the input, as the host's side of a data plane, to
// the plugin's serve loop (serveFrames over readFrame), then reads the
// answers back as the host does (readAnswer, decodeAnswer). Properties: no
// panic; no hang (the loop ends when the input does, a frame cut short
// included); the reader's buffer is bounded by the bytes that arrived, not
// by a frame's length field; every answer is a whole frame with status 0
// or 1 whose message decodes.
func FuzzServeFrames(f *testing.F) {
	f.Add(frameBytes(Release, 0, 0, 0, &kvxpb.Seqs{Seqs: []uint64{1, 2, 3}}))
	f.Add(append(frameBytes(Lookup, 0, 0, time.Now().Add(time.Hour).UnixNano(), &kvxpb.LookupRequest{}),
		frameBytes(EndStep, 0, FlagKeep, 0, &kvxpb.EndStepRequest{})...))
	f.Add(frameBytes(Forward, 0, FlagTake, 1, &kvxpb.Batch{}))
	f.Add(frameBytes(Method(200), 0, 0, 0, &kvxpb.Empty{}))
	f.Add(frameBytes(Release, 7, 0, 0, &kvxpb.Seqs{}))
	f.Add(frameBytes(Release, 0, 0, 0, &kvxpb.Seqs{Seqs: []uint64{1}})[:frameHeader+1])   // cut short
	f.Add([]byte{0xff, 0xff, 0xff, 0x3f, byte(Release), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) // 1 GiB claimed
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, byte(Release)})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzFrames {
			t.Skip()
		}
		host, plugin := socketPair(t)
		defer host.Close()
		pc, err := newPlaneConn(plugin)
		if err != nil {
			t.Fatal(err)
		}
		handlers := fuzzHandlers()
		served := make(chan struct{})
		go func() {
			defer close(served)
			serveFrames(context.Background(), pc, Sole(func() map[Method]Handler { return handlers }))
		}()
		// The write fails (EPIPE) when the loop ends before the input does:
		// it stops at a frame over the limit.
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			_, _ = host.Write(data)
			_ = host.CloseWrite()
		}()
		hp, err := newPlaneConn(host)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			<-served
			_ = pc.close() // the host reads EOF after the last answer
		}()
		d := &Plane{pc: hp}
		for {
			body, st, err := d.readAnswer()
			if err != nil {
				// A plugin that stops reading early closes with input unread:
				// the host then reads a reset.
				if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("reading the answers: %v", err)
				}
				break
			}
			if err := decodeAnswer(body, st, &kvxpb.Empty{}); err != nil && status.Code(err) != codes.InvalidArgument &&
				status.Code(err) != codes.Unimplemented {
				t.Fatalf("answer: %v, want OK, INVALID_ARGUMENT or UNIMPLEMENTED", err)
			}
		}
		<-served
		<-wrote
		if limit := 2*len(data) + 64<<10; cap(pc.in) > limit {
			t.Fatalf("serving %d bytes grew the read buffer to %d bytes, more than %d", len(data), cap(pc.in), limit)
		}
	})
}

// FuzzFrameRoundTrip writes a request frame (appendRequest) and an answer
// frame (appendResponse) and reads them back through a planeConn.
// Properties: the request reads back with the instance, method, flags and
// deadline it was written with and its message proto.Equal to the one
// sent; the answer decodes (decodeAnswer) to the response sent, or to an
// error with the code and message of the one sent (its message made UTF-8,
// as a status message must be).
func FuzzFrameRoundTrip(f *testing.F) {
	f.Add(uint16(0), uint8(Release), uint8(0), int64(0), []byte{1, 0, 0, 0, 0, 0, 0, 0}, uint32(0), "")
	f.Add(uint16(3), uint8(Forward), uint8(FlagKeep|FlagTake), time.Now().UnixNano(), []byte{}, uint32(codes.ResourceExhausted), "no room")
	f.Add(uint16(0xffff), uint8(255), uint8(0xff), int64(-1), make([]byte, 64), uint32(2), "bad \xff byte")
	f.Fuzz(func(t *testing.T, inst uint16, m, flags uint8, deadline int64, seqBytes []byte, code uint32, msg string) {
		if len(seqBytes)+len(msg) > maxFuzzFrames {
			t.Skip()
		}
		req := &kvxpb.Seqs{}
		for i := 0; i+8 <= len(seqBytes); i += 8 {
			req.Seqs = append(req.Seqs, binary.LittleEndian.Uint64(seqBytes[i:]))
		}
		cctx := context.Background()
		if deadline != 0 {
			var cancel context.CancelFunc
			cctx, cancel = context.WithDeadline(cctx, time.Unix(0, deadline))
			defer cancel()
		}
		var callErr error
		if code%17 != 0 {
			callErr = status.Error(codes.Code(code%17), msg)
		}
		b, err := (&Plane{}).appendRequest(nil, cctx, Frame{Inst: inst, M: Method(m), Flags: flags, Req: req})
		if err != nil {
			t.Fatalf("appendRequest: %v", err)
		}
		b, err = appendResponse(b, req, callErr)
		if err != nil {
			t.Fatalf("appendResponse(%v): %v", callErr, err)
		}

		host, plugin := socketPair(t)
		defer host.Close()
		defer plugin.Close()
		go func() { _, _ = host.Write(b) }()
		pc, err := newPlaneConn(plugin)
		if err != nil {
			t.Fatal(err)
		}
		hdr, body, err := pc.readFrame()
		if err != nil {
			t.Fatalf("readFrame (request): %v", err)
		}
		gotInst, gotM, gotFlags := binary.LittleEndian.Uint16(hdr[5:]), Method(hdr[4]), hdr[7]
		gotDL := int64(binary.LittleEndian.Uint64(hdr[8:]))
		if gotInst != inst || gotM != Method(m) || gotFlags != flags || gotDL != deadline {
			t.Fatalf("request header = inst %d, method %d, flags %#x, deadline %d; want %d, %d, %#x, %d", gotInst, gotM, gotFlags, gotDL, inst, m, flags, deadline)
		}
		got := &kvxpb.Seqs{}
		if err := proto.Unmarshal(body, got); err != nil || !proto.Equal(got, req) {
			t.Fatalf("request message = %v (%v), want %v", got, err, req)
		}
		d := &Plane{pc: pc}
		body, st, err := d.readAnswer()
		if err != nil {
			t.Fatalf("readAnswer: %v", err)
		}
		resp := &kvxpb.Seqs{}
		err = decodeAnswer(body, st, resp)
		switch {
		case callErr == nil && (err != nil || !proto.Equal(resp, req)):
			t.Fatalf("answer = %v, %v; want %v", resp, err, req)
		case callErr != nil && (status.Code(err) != status.Code(callErr) || status.Convert(err).Message() != strings.ToValidUTF8(msg, string(utf8.RuneError))):
			t.Fatalf("answer error = %v, want %v", err, callErr)
		}
	})
}
