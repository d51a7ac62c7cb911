package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/plan"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// hostRow matches a pool row of the host tier (after spaces are squeezed).
var hostRow = regexp.MustCompile(`(?m)^ ?\S+ host \d+ `)

// layouts configures every stage's manager of testdata/small.yaml with sets,
// in-process, as plan does: the layouts the plan must print.
func layouts(t *testing.T, sets ...string) ([]kvcache.Layout, *setup.Resolved) {
	t.Helper()
	cfg, _, err := config.Load(builtin.Registry(), []string{"testdata/small.yaml"}, nil, append([]string{"isolation=inprocess"}, sets...))
	if err != nil {
		t.Fatal(err)
	}
	res, err := setup.Resolve(cfg, "plan", false)
	if err != nil {
		t.Fatal(err)
	}
	l := setup.NewLauncher(cfg, builtin.Registry(), hclog.NewNullLogger())
	defer l.Close()
	var ls []kvcache.Layout
	for i := range res.Stages {
		m, err := l.Manager(context.Background(), i)
		if err != nil {
			t.Fatal(err)
		}
		layout, err := m.Configure(context.Background(), res.Spec.Managers[i])
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, layout)
	}
	return ls, res
}

// TestPlanShowsBothTiers: kvx plan (plugins, as users run it) prints, per
// stage, every pool of the manager's layout with its blocks, tokens and
// bytes and the host tier's totals against host_cache_size; without a host
// tier it says so and prints no host pool.
func TestPlanShowsBothTiers(t *testing.T) {
	sp := regexp.MustCompile(` +`)
	for _, tc := range []struct {
		manager, host string
		uses          string // the "host tier holds" line; "" without a host tier
	}{
		{"v1", "2GiB", "reuse offload (evicted reusable blocks, copied back on a hit)"},
		{"v2", "2GiB", "reuse offload (evicted reusable blocks, copied back on a hit) and suspend (preempted sequences, resumed without recompute), sharing one host budget"},
		{"v1", "0", ""},
		{"v2", "0", ""},
	} {
		sets := []string{"cache_manager=" + tc.manager, "kv_cache_config.host_cache_size=" + tc.host, "kv_cache_config.enable_block_reuse=true"}
		args := []string{"plan", "-c", "testdata/small.yaml"}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		out, stderr, code := kvx(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, stderr)
		}
		out = sp.ReplaceAllString(out, " ")
		ls, res := layouts(t, sets...)
		stages := strings.Split(out, "\nstage ")[1:]
		if len(stages) != len(ls) {
			t.Fatalf("%s host %s: %d stages printed, want %d\n%s", tc.manager, tc.host, len(stages), len(ls), out)
		}
		for i, layout := range ls {
			st := stages[i]
			host := plan.TierOf(layout, kvcache.TierHost)
			if (tc.uses != "") != (len(host.Pools) > 0) {
				t.Fatalf("%s host %s stage %d: layout has %d host pools, test expects a host tier: %v", tc.manager, tc.host, i, len(host.Pools), tc.uses != "")
			}
			for _, p := range layout.Pools {
				row := fmt.Sprintf("\n %s %s %d %d %d %d %s\n", p.Name, p.Tier, p.Blocks, p.TokensPerBlock, p.BlockBytes, p.Blocks*p.TokensPerBlock, plan.Size(int64(p.Blocks)*p.BlockBytes))
				if !strings.Contains(st, row) {
					t.Errorf("%s host %s stage %d: no row %q in\n%s", tc.manager, tc.host, i, row, st)
				}
			}
			if tc.uses == "" {
				if want := "\n host tier none (host_cache_size 0)\n"; !strings.Contains(st, want) {
					t.Errorf("%s host %s stage %d: no %q in\n%s", tc.manager, tc.host, i, want, st)
				}
				if hostRow.MatchString(st) {
					t.Errorf("%s host %s stage %d: a host pool row without a host tier:\n%s", tc.manager, tc.host, i, st)
				}
				continue
			}
			want := fmt.Sprintf("\n host tier %s of host_cache_size %s\n host tier holds %s\n",
				plan.Summary(host), plan.Size(res.Spec.Managers[i].HostBytes), tc.uses)
			if !strings.Contains(st, want) {
				t.Errorf("%s host %s stage %d: no %q in\n%s", tc.manager, tc.host, i, want, st)
			}
			if !(host.Bytes > 0 && host.Bytes <= res.Spec.Managers[i].HostBytes) {
				t.Errorf("%s host %s stage %d: host pools hold %d bytes of host_cache_size %d", tc.manager, tc.host, i, host.Bytes, res.Spec.Managers[i].HostBytes)
			}
		}
	}
}
