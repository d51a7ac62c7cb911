package pluginrpc

import (
	"context"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// The client always implements kvcache.EventReporter, as it does Suspender:
// a served manager that is no EventReporter answers KindUnsupported and its
// Info says no KVEvents (the server sees to both), and the core asks only a
// manager whose Info says KVEvents.
var _ kvcache.EventReporter = (*ManagerClient)(nil)

// Events implements kvcache.EventReporter.
func (c *ManagerClient) Events(ctx context.Context) ([]kvcache.Event, error) {
	const m = managerService + "Events"
	if exited(c.done) {
		return nil, errExited(m)
	}
	resp, err := c.rpc.Events(ctx, &kvxpb.EventsRequest{}, callOpts...)
	if err != nil {
		return nil, fromStatus(ctx, c.done, m, err, nil)
	}
	return fromProtoEvents(resp), nil
}

func (s *managerServer) Events(ctx context.Context, _ *kvxpb.EventsRequest) (*kvxpb.EventList, error) {
	er, ok := s.impl.(kvcache.EventReporter)
	if !ok {
		return nil, toStatus(kvcache.Errorf(kvcache.KindUnsupported, "Events: the cache manager reports no KV events (it is no kvcache.EventReporter)"), nil)
	}
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	evs, err := er.Events(ctx)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	return toProtoEvents(evs), nil
}
