package host

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// Describe says what f is, for a listing (kvx plugins): its contract (the
// kvcache protocol versions and the wire protocol, "-" when unknown), its
// features (FeatureText) and what it supports as it describes itself: its
// name and version, then a manager's mixers and capabilities
// (ManagerSupports) or a worker's device and mixers; or why it could not
// be described.
func (f Found) Describe() (contract, features, supports string) {
	contract, features, supports = "-", "-", "-"
	if c := f.Contract; c != nil {
		contract, features = fmt.Sprintf("wire %d", c.Protocol), FeatureText(*c)
	}
	switch {
	case f.Err != nil:
		supports = "error: " + f.Err.Error()
	case f.Manager != nil:
		i := f.Manager
		contract = fmt.Sprintf("%v, %s", i.Protocols, contract)
		supports = i.Name + " " + i.Version + ": " + ManagerSupports(i.Capabilities)
	case f.Worker != nil:
		i := f.Worker
		contract = fmt.Sprintf("%v, %s", i.Protocols, contract)
		var mx []string
		for _, m := range i.Mixers {
			if m == "" {
				mx = append(mx, "ffn-only")
				continue
			}
			mx = append(mx, string(m))
		}
		supports = i.Name + " " + i.Version + ": device " + i.Device + ": " + strings.Join(mx, ", ")
	}
	return contract, features, supports
}

// ManagerSupports lists a manager's mixers and capabilities.
func ManagerSupports(c kvcache.Capabilities) string {
	var caps []string
	for _, m := range c.Mixers {
		caps = append(caps, string(m))
	}
	for _, x := range []struct {
		on   bool
		name string
	}{{c.PrefixReuse, "prefix-reuse"}, {c.HostTier, "host-tier"}, {c.SSMState, "ssm-state"}, {c.SSMReuse, "ssm-reuse"}, {c.CacheSalt, "cache-salt"}, {c.KVEvents, "kv-events"},
		{c.Explain, "explain"}, {c.Retention, "retention"}} {
		if x.on {
			caps = append(caps, x.name)
		}
	}
	if len(c.EvictionPolicies) > 0 {
		caps = append(caps, "eviction:"+strings.Join(c.EvictionPolicies, "/"))
	}
	return strings.Join(caps, ", ")
}

// FeatureText names a side's features for a table cell: "all N" when they
// are exactly this kvx's N and none is required, else FeatureList.
func FeatureText(c pluginrpc.Contract) string {
	all := pluginrpc.Current().Features
	if len(c.Required) == 0 && len(c.Features) == len(all) && !slices.ContainsFunc(all, func(f pluginrpc.Feature) bool { return !c.Has(f) }) {
		return fmt.Sprintf("all %d", len(all))
	}
	return FeatureList(c)
}

// FeatureList names a side's features: "top_logprobs,kv_events*" (a
// required one starred), "none", or "?" when only its handshake is known.
func FeatureList(c pluginrpc.Contract) string {
	if c.Features == nil && c.Required == nil && c.Build == "" {
		return "?"
	}
	var fs []string
	for _, f := range c.Features {
		if slices.Contains(c.Required, f) {
			fs = append(fs, string(f)+"*")
		} else {
			fs = append(fs, string(f))
		}
	}
	for _, f := range c.Required {
		if !slices.Contains(c.Features, f) {
			fs = append(fs, string(f)+"*")
		}
	}
	if len(fs) == 0 {
		return "none"
	}
	return strings.Join(fs, ",")
}
