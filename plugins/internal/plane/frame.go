package plane

import (
	"context"
	"encoding/binary"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Data plane versions. Version 2 adds an instance (u16, header bytes 5-6)
// and flags (byte 7) to request frames; in version 1 those bytes are zero.
// Version 3 is version 2's frames in shared memory (shmLink), on Linux.
// Version, the newest this package speaks, is 3 on Linux and 2
// elsewhere (shm_*.go). A plugin serves every version it speaks; a host
// asks for the newest when the plugin serves instances (InstancesProtocol),
// and for 2 when the plugin does not serve 3 (an older plugin, or one on
// another system).

// servesVersion reports whether this package serves data plane version v.
func servesVersion(v uint32) bool { return v >= 1 && v <= Version }

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

// frameFlags are bits of a request frame's byte 7 (data plane version 2).
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
	if d.instanced {
		binary.LittleEndian.PutUint16(b[at+5:], f.Inst)
		b[at+7] = f.Flags
	} else if f.Inst != 0 || f.Flags != 0 {
		return b[:at], status.Errorf(codes.Internal, "data plane version 1 carries no instance %d or flags %#x", f.Inst, f.Flags)
	}
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
