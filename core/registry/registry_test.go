package registry

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

func testRegistry() *Registry {
	newM := func() kvcache.Manager { return nil }
	newW := func() worker.Worker { return nil }
	return &Registry{
		Managers: []Manager{
			{Name: "a", Binary: "kvx-a", Capabilities: kvcache.Capabilities{Mixers: []spec.Mixer{spec.MixerGQA}}, New: newM},
			{Name: "b", Binary: "kvx-b", Capabilities: kvcache.Capabilities{Mixers: []spec.Mixer{spec.MixerGQA, spec.MixerMamba}}, New: newM},
		},
		Backends: []Backend{
			{Name: "x", Binary: "kvx-backend-x", Mixers: []spec.Mixer{spec.MixerDSA}, New: newW},
			{Name: "y", Binary: "kvx-backend-y", Mixers: []spec.Mixer{spec.MixerMLA, spec.MixerDSA}, New: newW},
		},
	}
}

// TestLookups: names, binaries, paths and the entries that fit, in
// registry order; a nil registry has none.
func TestLookups(t *testing.T) {
	r := testRegistry()
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ got, want string }{
		{r.ManagerBinary("b"), "kvx-b"},
		{r.ManagerBinary("./kvx-z"), "./kvx-z"},
		{r.ManagerBinary("z"), ""},
		{r.BackendBinary("y"), "kvx-backend-y"},
		{r.BackendBinary("/opt/kvx-w"), "/opt/kvx-w"},
		{Or(r.BackendNames()), "x or y"},
		{Or([]string{"a", "b", "c"}), "a, b or c"},
		{MixerList([]spec.Mixer{spec.MixerGQA, spec.MixerNone}), "gqa, none (ffn only)"},
		{r.Setting("kvx-b", pluginrpc.ManagerPluginName), "cache_manager: b"},
		{r.Setting("kvx-backend-y", pluginrpc.WorkerPluginName), "attention_backend: y"},
		{r.Setting("kvx-mine", pluginrpc.ManagerPluginName), "cache_manager: PATH"},
		{r.Setting("kvx-mine", pluginrpc.WorkerPluginName), "attention_backend: PATH"},
		{r.Setting("kvx-mine", ""), "-"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if key, name := r.Named("kvx-backend-y"); key != "attention_backend" || name != "y" {
		t.Errorf("Named(kvx-backend-y) = %q, %q", key, name)
	}
	names := func(bs []Backend) (s []string) {
		for _, b := range bs {
			s = append(s, b.Name)
		}
		return s
	}
	if got := names(r.BackendsFor([]spec.Mixer{spec.MixerDSA})); !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("BackendsFor(dsa) = %v, want x, y", got)
	}
	if got := names(r.BackendsFor([]spec.Mixer{spec.MixerMLA})); !slices.Equal(got, []string{"y"}) {
		t.Errorf("BackendsFor(mla) = %v, want y", got)
	}
	if got := r.ManagersFor([]spec.Mixer{spec.MixerMamba, spec.MixerGQA}); len(got) != 1 || got[0].Name != "b" {
		t.Errorf("ManagersFor(mamba, gqa) = %v, want b", got)
	}
	m := spec.Model{Layers: []spec.Layer{{Mixer: spec.MixerMamba}, {Mixer: spec.MixerNone}, {Mixer: spec.MixerGQA}, {Mixer: spec.MixerMamba}}}
	if got := ModelMixers(m); !slices.Equal(got, []spec.Mixer{spec.MixerMamba, spec.MixerGQA}) {
		t.Errorf("ModelMixers = %v, want mamba, gqa", got)
	}
	want := [][2]string{{"cache_manager: a", "kvx-a"}, {"cache_manager: b", "kvx-b"}, {"attention_backend: x", "kvx-backend-x"}, {"attention_backend: y", "kvx-backend-y"}}
	if got := r.Settings(); !slices.Equal(got, want) {
		t.Errorf("Settings = %v, want %v", got, want)
	}
	var none *Registry
	if _, ok := none.Manager("a"); ok || none.ManagerNames() != nil || none.BackendsFor(nil) != nil || none.Check() != nil || none.Settings() != nil {
		t.Error("a nil registry has entries")
	}
}

// TestCheck reports every malformed entry at once.
func TestCheck(t *testing.T) {
	r := testRegistry()
	r.Managers = append(r.Managers, Manager{Name: "a", Binary: "a-bin"}, Manager{Name: "./p", Binary: "kvx-p"})
	r.Backends[0].Mixers = nil
	err := r.Check()
	for _, w := range []string{`cache manager "a": registered twice`, `cache manager "a": binary "a-bin" is not a file name starting with kvx-`,
		`cache manager "a": no in-process factory`, `cache manager "./p": a name may not contain a path separator`, `attention backend "x": serves no mixer`} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Check() = %v; want it to contain %q", err, w)
		}
	}
}
