// Package plane is the byte plane of kvx's plugin transport: the per-step
// calls as length-prefixed frames of the RPCs' own protobuf messages on a
// private local socket beside the gRPC connection, or on Linux in two byte
// rings in shared memory (the frame format is documented at DataPlane in
// kvx.proto). plugins/v1/pluginrpc, which adapts contract v1 to go-plugin
// and gRPC, is its only user; it knows nothing of kvcache or worker.
//
// Why: every call of a step crosses processes. Over gRPC a unary call costs
// about twenty system calls on the two sides (HTTP/2 frames, the netpoller,
// goroutine hand-offs between the reader, the handler and the writer); on a
// virtual machine with page-table isolation those dominate a sim replay. A
// frame costs one write and one read per side. gRPC stays the control plane
// (the handshake, Info, Configure, Stats, Inspect, Health) and the fallback:
// a plugin that does not open a data plane is called over gRPC for
// everything, and a client that keeps off the plane never asks.
//
// Its parts, by idea:
//
//   - frame.go: the framing and codec: the versions, the header (length,
//     method or status, instance, flags, deadline), request and answer
//     frames and their decoding.
//   - conn.go (conn_linux.go, conn_other.go): one end's connection:
//     buffered whole-frame reads and writes on the socket, a short bounded
//     poll before parking in the netpoller, and the doorbell reads.
//   - shm_linux.go (shm_other.go): the shared-memory rings of version 3, a
//     futex to wake a sleeping reader and a doorbell byte for a parked one.
//   - serve.go: the plugin side's dispatch: Serve opens a plane, checks the
//     host's token and answers frames with the Handler of the instance and
//     Method each names, watching for the host hanging up on a long call.
//   - plane.go: the host side: a Plane pipelines the calls of several
//     goroutines, corks calls to send them with the next write, and hands
//     each answer to its call; an Opener keeps a client's plane.
package plane
