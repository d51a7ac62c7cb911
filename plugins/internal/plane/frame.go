package plane

import (
	"context"
	"encoding/binary"
	"strings"
	"time"
	"unicode/utf8"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Data plane versions: one per platform, Version (shm_*.go). Version 2
// carries the frames on the socket (every system but Linux); version 3
// carries the same frames in shared memory (shmLink), on Linux. A frame
// names its instance (u16, header bytes 5-6) and has flags (byte 7). Host
// and plugin are built for the same system, so they speak the same one.

// MaxMessageBytes bounds the message of one frame, as it bounds one gRPC
// message of the plugin connection (pluginrpc.MaxMessageBytes).
const MaxMessageBytes = 1 << 30

const (
	frameHeader = 16 // u32 length, u8 method or status, u16 instance, u8 flags, i64 deadline
	tokenBytes  = 32
	// acceptWait bounds how long a plugin waits for the host to connect.
	acceptWait = 30 * time.Second
)

// method numbers the RPCs a data plane carries. Append only.
type Method uint8

const (
	Lookup Method = iota + 1
	Reserve
	Unreserve
	Commit
	Suspend
	Resume
	Release
	EndStep
	Forward
	CopyBlocks
)

// Response status byte.
const (
	frameOK  = 0
	frameErr = 1
)

// appendResponse appends the response frame of (resp, callErr) to b.
func appendResponse(b []byte, resp proto.Message, callErr error) ([]byte, error) {
	at := len(b)
	b = append(b, make([]byte, frameHeader)...)
	var err error
	if callErr != nil {
		b[at+4] = frameErr
		// A status message is a proto string, which must be UTF-8 (gRPC
		// percent-encodes it instead): bad bytes become U+FFFD, so an error
		// that quotes outside bytes still reaches the host.
		sp := status.Convert(callErr).Proto()
		sp.Message = strings.ToValidUTF8(sp.Message, string(utf8.RuneError))
		b, err = proto.MarshalOptions{}.MarshalAppend(b, sp)
	} else {
		b, err = proto.MarshalOptions{}.MarshalAppend(b, resp)
	}
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-frameHeader))
	return b, nil
}

// frameFlags are bits of a request frame's byte 7.
const (
	// FlagKeep: this Forward's Result.Hidden stays in the plugin for the
	// next frame instead of crossing back (ForwardChain).
	FlagKeep = 1 << 0
	// FlagTake: this Forward's Batch.Hidden is what the previous frame
	// kept; the call fails, unrun, when that frame failed.
	FlagTake = 1 << 1
)

// appendRequest appends the request frame of f, with ctx's deadline, to b.
func (d *Plane) appendRequest(b []byte, ctx context.Context, f Frame) ([]byte, error) {
	at := len(b)
	b = append(b, make([]byte, frameHeader)...)
	b[at+4] = byte(f.M)
	binary.LittleEndian.PutUint16(b[at+5:], f.Inst)
	b[at+7] = f.Flags
	if dl, ok := ctx.Deadline(); ok {
		binary.LittleEndian.PutUint64(b[at+8:], uint64(dl.UnixNano()))
	}
	b, err := proto.MarshalOptions{}.MarshalAppend(b, f.Req)
	if err != nil {
		return b[:at], status.Errorf(codes.Internal, "data plane: encode request: %v", err)
	}
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-frameHeader))
	return b, nil
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
