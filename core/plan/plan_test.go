package plan

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// planLines renders WriteTiers through the tabwriter plan uses and returns
// its lines with runs of spaces squeezed to one.
func planLines(layout kvcache.Layout, caps kvcache.Capabilities, mc kvcache.Config) []string {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	WriteTiers(tw, layout, caps, mc)
	tw.Flush()
	sp := regexp.MustCompile(` +`)
	var out []string
	for _, l := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
		out = append(out, strings.TrimSpace(sp.ReplaceAllString(l, " ")))
	}
	return out
}

// TestWriteTiers: the pool rows and the tier totals are the layout's own
// numbers (odd ones, which no sizing rule would produce), pools grouped by
// tier; what the host tier holds follows the manager's capabilities.
func TestWriteTiers(t *testing.T) {
	layout := kvcache.Layout{Pools: []kvcache.Pool{
		{ID: 0, Name: "full", Tier: kvcache.TierDevice, TokensPerBlock: 32, BlockBytes: 3 << 20, Blocks: 1001},
		{ID: 1, Name: "host-full", Tier: kvcache.TierHost, TokensPerBlock: 32, BlockBytes: 3 << 20, Blocks: 7777},
		{ID: 2, Name: "ssm", Tier: kvcache.TierDevice, BlockBytes: 5000, Blocks: 13},
		{ID: 3, Name: "host-ssm", Tier: kvcache.TierHost, BlockBytes: 5000, Blocks: 3},
	}}
	mc := kvcache.Config{HostBytes: 24 << 30, EnableBlockReuse: true}
	both := kvcache.Capabilities{PrefixReuse: true, HostTier: true}
	got := planLines(layout, both, mc)
	want := []string{
		"pool tier blocks tokens/block bytes/block tokens bytes",
		"full device 1001 32 3145728 32032 2.93 GiB",
		"ssm device 13 0 5000 - 63.48 KiB",
		"host-full host 7777 32 3145728 248864 22.78 GiB",
		"host-ssm host 3 0 5000 - 14.65 KiB",
		"device tier 2 pools, 1014 blocks, 32032 tokens, 13 sequence states, 2.93 GiB",
		"host tier 2 pools, 7780 blocks, 248864 tokens, 3 sequence states, 22.78 GiB of host_cache_size 24.00 GiB",
		"host tier holds reuse offload (evicted reusable blocks, copied back on a hit) and suspend (preempted sequences, resumed without recompute), sharing one host budget",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("WriteTiers =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, tc := range []struct {
		name string
		caps kvcache.Capabilities
		mc   kvcache.Config
		want string
	}{
		{"reuse only (v1)", kvcache.Capabilities{PrefixReuse: true}, mc, "host tier holds reuse offload (evicted reusable blocks, copied back on a hit)"},
		{"suspend only: reuse off", both, kvcache.Config{HostBytes: mc.HostBytes}, "host tier holds suspend (preempted sequences, resumed without recompute)"},
		{"neither", kvcache.Capabilities{}, mc, "host tier holds nothing this manager says it uses"},
	} {
		if got := planLines(layout, tc.caps, tc.mc); got[len(got)-1] != tc.want {
			t.Errorf("%s: last line %q, want %q", tc.name, got[len(got)-1], tc.want)
		}
	}

	devOnly := kvcache.Layout{Pools: layout.Pools[:1]}
	for _, tc := range []struct {
		hostBytes int64
		want      string
	}{
		{0, "host tier none (host_cache_size 0)"},
		{1 << 30, "host tier none: host_cache_size 1.00 GiB is not used by this manager here (see the warnings)"},
	} {
		got := planLines(devOnly, both, kvcache.Config{HostBytes: tc.hostBytes, EnableBlockReuse: true})
		if g := got[len(got)-1]; g != tc.want {
			t.Errorf("host_cache_size %d without host pools: last line %q, want %q", tc.hostBytes, g, tc.want)
		}
		if hostRow.MatchString(strings.Join(got, "\n")) {
			t.Errorf("host_cache_size %d without host pools: a host row in\n%s", tc.hostBytes, strings.Join(got, "\n"))
		}
	}
}

// hostRow matches a pool row of the host tier (after spaces are squeezed).
var hostRow = regexp.MustCompile(`(?m)^ ?\S+ host \d+ `)
