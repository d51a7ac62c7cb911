package pluginrpc

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/internal/plane"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Instances: one plugin process serves every pipeline stage.
//
// A plugin process serves any number of instances of its manager or
// worker, each made by the plugin's factory on first use: the host runs one
// process per plugin binary instead of one per stage, and the stages' calls
// of a step reach that process together. A gRPC call names its instance in
// the metadata key instanceKey (none: instance 0); a data plane frame in
// bytes 5 and 6 of its header.

// InstancesProtocol is the name Protocol had when protocol 2 made a process
// serve several instances; every protocol since does.
const InstancesProtocol = Protocol

// MaxInstances bounds the instances one plugin process serves.
const MaxInstances = 64

// instanceKey is the gRPC metadata key naming the instance of a call.
const instanceKey = "kvx-instance"

// instances makes and keeps the instances of one served kind.
type instances[S any] struct {
	mu   sync.Mutex
	made map[uint16]S
	make func(id uint16) S
}

func newInstances[S any](make func(id uint16) S) *instances[S] {
	return &instances[S]{made: map[uint16]S{}, make: make}
}

// get returns instance id, making it on first use.
func (r *instances[S]) get(id uint16) (S, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.made[id]; ok {
		return s, nil
	}
	var zero S
	if int(id) >= MaxInstances {
		return zero, status.Errorf(codes.InvalidArgument, "instance %d: a plugin process serves at most %d instances (0 to %d)", id, MaxInstances, MaxInstances-1)
	}
	s := r.make(id)
	r.made[id] = s
	return s, nil
}

// instanceOf returns the instance a gRPC call names.
func instanceOf(ctx context.Context) (uint16, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(instanceKey)
	if len(v) == 0 {
		return 0, nil
	}
	n, err := strconv.ParseUint(v[0], 10, 16)
	if err != nil || len(v) > 1 {
		return 0, status.Errorf(codes.InvalidArgument, "metadata %s = %q is not one instance number", instanceKey, v)
	}
	return uint16(n), nil
}

// routed returns desc with every handler calling the service of the
// instance its call names (pick) instead of the registered one.
func routed(desc grpc.ServiceDesc, pick func(ctx context.Context) (any, error)) *grpc.ServiceDesc {
	d := desc
	d.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		h := m.Handler
		m.Handler = func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			srv, err := pick(ctx)
			if err != nil {
				return nil, err
			}
			return h(srv, ctx, dec, ic)
		}
		d.Methods[i] = m
	}
	d.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, st := range desc.Streams {
		h := st.Handler
		st.Handler = func(_ any, stream grpc.ServerStream) error {
			srv, err := pick(stream.Context())
			if err != nil {
				return err
			}
			return h(srv, stream)
		}
		d.Streams[i] = st
	}
	return &d
}

// registerManagers registers a CacheManager service on s whose calls go to
// the instance they name, each made by newManager on first use.
func registerManagers(s grpc.ServiceRegistrar, newManager func() kvcache.Manager) {
	registerInstances(s, kvxpb.CacheManager_ServiceDesc, func() *managerServer {
		return &managerServer{impl: newManager(), gate: newGate()}
	})
}

// registerWorkers is registerManagers for workers.
func registerWorkers(s grpc.ServiceRegistrar, newWorker func() worker.Worker) {
	registerInstances(s, kvxpb.Worker_ServiceDesc, func() *workerServer {
		return &workerServer{impl: newWorker(), gate: newGate()}
	})
}

// server is what registerInstances needs of a service's server.
type server interface {
	handlers() map[plane.Method]plane.Handler
	setRoute(plane.Route)
}

func (s *managerServer) setRoute(r plane.Route) { s.route = r }
func (s *workerServer) setRoute(r plane.Route)  { s.route = r }

// registerInstances registers desc on reg with each call going to the
// instance it names, made by newServer on first use; every instance's data
// plane serves the frames of all of them.
func registerInstances[S server](reg grpc.ServiceRegistrar, desc grpc.ServiceDesc, newServer func() S) {
	var r *instances[S]
	r = newInstances(func(uint16) S {
		srv := newServer()
		srv.setRoute(func(id uint16) (map[plane.Method]plane.Handler, error) {
			inst, err := r.get(id)
			if err != nil {
				return nil, err
			}
			return inst.handlers(), nil
		})
		return srv
	})
	reg.RegisterService(routed(desc, func(ctx context.Context) (any, error) {
		id, err := instanceOf(ctx)
		if err != nil {
			return nil, err
		}
		return r.get(id)
	}), nil)
}

// instanceConn is a connection whose calls name one instance.
type instanceConn struct {
	cc grpc.ClientConnInterface
	id string
}

func (c instanceConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return c.cc.Invoke(metadata.AppendToOutgoingContext(ctx, instanceKey, c.id), method, args, reply, opts...)
}

func (c instanceConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.cc.NewStream(metadata.AppendToOutgoingContext(ctx, instanceKey, c.id), desc, method, opts...)
}

// family is what the instance clients of one plugin process share: the
// connection, the data plane and the next instance number.
type family struct {
	cc     grpc.ClientConnInterface
	opener *plane.Opener
	mu     sync.Mutex
	next   uint16
	// agreed is what Negotiate found both sides offer (contract.go);
	// negotiated is false until it ran.
	agreed     []Feature
	negotiated bool
}

// take returns the next instance number.
func (f *family) take() (uint16, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if int(f.next) >= MaxInstances {
		return 0, fmt.Errorf("a plugin process serves at most %d instances", MaxInstances)
	}
	id := f.next
	f.next++
	return id, nil
}

// conn returns the connection for instance id.
func (f *family) conn(id uint16) grpc.ClientConnInterface {
	if id == 0 {
		return f.cc
	}
	return instanceConn{cc: f.cc, id: strconv.Itoa(int(id))}
}
