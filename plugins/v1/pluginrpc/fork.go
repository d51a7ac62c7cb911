package pluginrpc

import (
	"context"
	"fmt"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// The client always implements kvcache.Forker, as it does Suspender: a
// served manager that is no Forker answers KindUnsupported and its Info
// says no Fork (the server sees to both), and the core forks only on a
// manager whose Info says Fork. A plugin without feature fork never says
// Fork (it does not know the field), and the client refuses the call
// without sending it.
var _ kvcache.Forker = (*ManagerClient)(nil)

// Fork implements kvcache.Forker.
func (c *ManagerClient) Fork(ctx context.Context, items []kvcache.ForkItem) ([]kvcache.Grant, error) {
	const m = managerService + "Fork"
	if exited(c.done) {
		return nil, errExited(m)
	}
	if !c.fam.has(FeatureFork) {
		return nil, kvcache.Errorf(kvcache.KindUnsupported, "kvx plugin %s: the plugin does not offer feature %s", m, FeatureFork)
	}
	resp, err := c.rpc.Fork(ctx, toProtoForkRequest(items), callOpts...)
	return answerOf(ctx, c.done, m, resp, err, fromProtoReserveResponse)
}

func (s *managerServer) Fork(ctx context.Context, req *kvxpb.ForkRequest) (*kvxpb.ReserveResponse, error) {
	fk, ok := s.impl.(kvcache.Forker)
	if !ok {
		return nil, toStatus(kvcache.Errorf(kvcache.KindUnsupported, "Fork: the cache manager does not fork sequences (it is no kvcache.Forker)"), nil)
	}
	items, err := fromProtoForkRequest(req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	grants, err := fk.Fork(ctx, items)
	out := toProtoReserveResponse(grants)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func toProtoForkRequest(items []kvcache.ForkItem) *kvxpb.ForkRequest {
	p := &kvxpb.ForkRequest{Parent: make([]uint64, len(items)), Child: make([]uint64, len(items))}
	for i, it := range items {
		p.Parent[i], p.Child[i] = uint64(it.Parent), uint64(it.Child)
	}
	return p
}

func fromProtoForkRequest(p *kvxpb.ForkRequest) ([]kvcache.ForkItem, error) {
	parent, child := p.GetParent(), p.GetChild()
	if len(parent) != len(child) {
		return nil, kvcache.Errorf(kvcache.KindInvalidArg, "%s", fmt.Sprintf("ForkRequest: %d parents and %d children", len(parent), len(child)))
	}
	if len(parent) == 0 {
		return nil, nil
	}
	items := make([]kvcache.ForkItem, len(parent))
	for i := range items {
		items[i] = kvcache.ForkItem{Parent: kvcache.SeqID(parent[i]), Child: kvcache.SeqID(child[i])}
	}
	return items, nil
}
