//go:build unix

package host

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Plugins of other contract revisions against this host, and this build's
// plugin against hosts of other revisions (a Host whose Hello says an
// older contract). The fake plugin plays the other revision: its handshake
// version and its Hello come from FAKEPLUGIN_TRANSPORT, _FEATURES and
// _REQUIRES.

// refused launches path on h and checks that the launch is refused with
// an error that wraps ErrProtocol and pluginrpc.ErrMismatch, contains every
// want, and leaves nothing running.
func refused(t *testing.T, h *Host, path string, want ...string) {
	t.Helper()
	var err error
	if strings.Contains(path, "worker") {
		_, _, err = h.LaunchWorker(ctxTimeout(t), path)
	} else {
		_, _, err = h.LaunchManager(ctxTimeout(t), path)
	}
	if err == nil {
		t.Fatalf("launch of %s succeeded, want a refusal", path)
	}
	t.Log(err)
	if !errors.Is(err, ErrProtocol) || !errors.Is(err, pluginrpc.ErrMismatch) {
		t.Errorf("errors.Is(err, ErrProtocol) = %v, errors.Is(err, pluginrpc.ErrMismatch) = %v, want both",
			errors.Is(err, ErrProtocol), errors.Is(err, pluginrpc.ErrMismatch))
	}
	for _, w := range append([]string{path}, want...) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	if n := tracked(h); n != 0 {
		t.Errorf("%d plugin processes still tracked after the refused launch", n)
	}
}

// TestOlderProtocolPlugin: a plugin of the previous wire protocol (2, as
// every plugin built before the Contract service said) is refused at the
// handshake, naming both protocols and telling to rebuild the plugin.
func TestOlderProtocolPlugin(t *testing.T) {
	t.Setenv("FAKEPLUGIN_TRANSPORT", "2")
	h, _ := newHost(t)
	refused(t, h, fakeManager,
		"the plugin is older than this kvx",
		"plugin: protocol 2 (protocols before 3 exchange no feature list)",
		fmt.Sprintf("kvx: protocol 3, features %v", pluginrpc.Current().Features),
		"rebuild the plugin against this kvx's plugins/sdk")
}

// TestNewerProtocolPlugin: a plugin of a wire protocol this kvx does not
// know yet is refused at the handshake, telling which kvx to use.
func TestNewerProtocolPlugin(t *testing.T) {
	t.Setenv("FAKEPLUGIN_TRANSPORT", "9")
	h, _ := newHost(t)
	refused(t, h, fakeWorker,
		"the plugin is newer than this kvx", "plugin: protocol 9", "kvx: protocol 3",
		"use a kvx that speaks protocol 9")
}

// TestPluginRequiresAFeatureThisKvxLacks: a newer plugin of the same
// protocol that requires a feature this kvx does not know is refused at
// Hello, naming the feature.
func TestPluginRequiresAFeatureThisKvxLacks(t *testing.T) {
	t.Setenv("FAKEPLUGIN_FEATURES", "top_logprobs,kv_teleport")
	t.Setenv("FAKEPLUGIN_REQUIRES", "kv_teleport")
	h, _ := newHost(t)
	refused(t, h, fakeManager,
		"the plugin requires feature kv_teleport, which this kvx lacks",
		"features [top_logprobs kv_teleport], requires [kv_teleport]")
}

// TestPluginWithUnknownFeature: a newer plugin offering a feature this kvx
// does not know works; the feature is ignored.
func TestPluginWithUnknownFeature(t *testing.T) {
	t.Setenv("FAKEPLUGIN_FEATURES", "kv_teleport,top_logprobs")
	h, _ := newHost(t)
	_, proc, err := h.LaunchManager(ctxTimeout(t), fakeManager)
	if err != nil {
		t.Fatalf("LaunchManager: %v", err)
	}
	if got, want := proc.Features(), []pluginrpc.Feature{pluginrpc.FeatureTopLogprobs}; !slices.Equal(got, want) {
		t.Errorf("Features() = %v, want %v", got, want)
	}
	if got := proc.Contract().Features; !slices.Contains(got, "kv_teleport") {
		t.Errorf("Contract().Features = %v, want the plugin's own list with kv_teleport", got)
	}
}

// TestOlderPluginWithoutAFeature: a worker from before top_logprobs (same
// protocol, an additive difference) works; a batch that asks it for top
// logprobs, which it would ignore, is refused with KindUnsupported naming
// the feature, and the others run.
func TestOlderPluginWithoutAFeature(t *testing.T) {
	t.Setenv("FAKEPLUGIN_FEATURES", "-")
	h, _ := newHost(t)
	w, proc, err := h.LaunchWorker(ctxTimeout(t), fakeWorker)
	if err != nil {
		t.Fatalf("LaunchWorker: %v", err)
	}
	if got := proc.Features(); len(got) != 0 {
		t.Errorf("Features() = %v, want none", got)
	}
	item := worker.Item{Seq: 5, Sample: true, Tokens: []int32{1}}
	if _, err := w.Forward(ctxTimeout(t), worker.Batch{Step: 1, Items: []worker.Item{item}}); err != nil {
		t.Errorf("Forward without top logprobs: %v", err)
	}
	item.TopLogprobs = 3
	_, err = w.Forward(ctxTimeout(t), worker.Batch{Step: 2, Items: []worker.Item{item}})
	if kvcache.KindOf(err) != kvcache.KindUnsupported || !strings.Contains(fmtErr(err), "feature top_logprobs") {
		t.Errorf("Forward with TopLogprobs 3 = %v, want KindUnsupported naming feature top_logprobs", err)
	}
	// A sim calibration it would ignore is refused at Configure.
	var cfg worker.Config
	cfg.Hardware.Calibration = &spec.SimCalibration{Name: "h200-test"}
	_, err = w.Configure(ctxTimeout(t), cfg)
	if kvcache.KindOf(err) != kvcache.KindUnsupported || !strings.Contains(fmtErr(err), "feature sim_calibration") {
		t.Errorf("Configure with a calibration = %v, want KindUnsupported naming feature sim_calibration", err)
	}
	// So is a copy latency that a sim worker would ignore; a cpu worker
	// has no cost model and is configured.
	cfg = worker.Config{Device: "sim"}
	cfg.Hardware.CopyLatency = 5e-6
	_, err = w.Configure(ctxTimeout(t), cfg)
	if kvcache.KindOf(err) != kvcache.KindUnsupported || !strings.Contains(fmtErr(err), "feature copy_latency") {
		t.Errorf("Configure(sim) with a copy latency = %v, want KindUnsupported naming feature copy_latency", err)
	}
	cfg.Device = "cpu"
	if _, err = w.Configure(ctxTimeout(t), cfg); kvcache.KindOf(err) == kvcache.KindUnsupported {
		t.Errorf("Configure(cpu) with a copy latency = %v, want no feature refusal", err)
	}
}

// TestOlderHost: this build's plugin against hosts of older revisions: a
// host of the same protocol without top_logprobs works (and uses none); a
// host of protocol 2 is refused at the handshake; a host that requires a
// feature the plugin lacks is refused at Hello.
func TestOlderHost(t *testing.T) {
	older := func(c pluginrpc.Contract) *Host {
		h, _ := newHost(t)
		h.contract = &c
		return h
	}
	h := older(pluginrpc.Contract{Protocol: pluginrpc.Protocol})
	_, proc, err := h.LaunchManager(ctxTimeout(t), fakeManager)
	if err != nil {
		t.Fatalf("LaunchManager from a host without features: %v", err)
	}
	if got := proc.Features(); len(got) != 0 {
		t.Errorf("Features() = %v, want none", got)
	}
	if got, want := proc.Contract().Features, pluginrpc.Current().Features; !slices.Equal(got, want) {
		t.Errorf("Contract().Features = %v, want the plugin's %v", got, want)
	}

	refused(t, older(pluginrpc.Contract{Protocol: 2}), fakeManager,
		"the plugin is newer than this kvx", "plugin: protocol 3", "kvx: protocol 2")
	refused(t, older(pluginrpc.Contract{Protocol: pluginrpc.Protocol, Features: []pluginrpc.Feature{"kv_teleport"},
		Required: []pluginrpc.Feature{"kv_teleport"}}), fakeWorker,
		"this kvx requires feature kv_teleport, which the plugin lacks",
		"rebuild the plugin against this kvx's plugins/sdk")
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestOlderWorkerWithoutPromptLogprobs: a worker plugin process from before
// feature prompt_logprobs (every other feature of this build) gets no item
// that asks for prompt rows: Forward fails those items alone, as an
// item-scoped error naming the feature (the engine fails their requests
// and runs the others), and forwards the rest.
func TestOlderWorkerWithoutPromptLogprobs(t *testing.T) {
	var old []string
	for _, f := range pluginrpc.Current().Features {
		if f != pluginrpc.FeaturePromptLogprobs {
			old = append(old, string(f))
		}
	}
	t.Setenv("FAKEPLUGIN_FEATURES", strings.Join(old, ","))
	h, _ := newHost(t)
	w, proc, err := h.LaunchWorker(ctxTimeout(t), fakeWorker)
	if err != nil {
		t.Fatalf("LaunchWorker: %v", err)
	}
	if slices.Contains(proc.Features(), pluginrpc.FeaturePromptLogprobs) {
		t.Fatalf("Features() = %v, want no %s", proc.Features(), pluginrpc.FeaturePromptLogprobs)
	}
	plain := worker.Item{Seq: 5, Sample: true, Tokens: []int32{1, 2}}
	if _, err := w.Forward(ctxTimeout(t), worker.Batch{Step: 1, Items: []worker.Item{plain}}); err != nil {
		t.Errorf("Forward without prompt logprobs: %v", err)
	}
	asking := worker.Item{Seq: 6, Sample: true, Tokens: []int32{1, 2}, PromptLogprobs: true, PromptTopLogprobs: 2}
	_, err = w.Forward(ctxTimeout(t), worker.Batch{Step: 2, Items: []worker.Item{plain, asking}})
	var ke *kvcache.Error
	if !errors.As(err, &ke) || ke.Kind != kvcache.KindInvalidArg || !slices.Equal(ke.Seqs, []kvcache.SeqID{6}) ||
		!strings.Contains(fmtErr(err), "feature prompt_logprobs") {
		t.Errorf("Forward with an item asking for prompt rows = %v, want an item error for seq 6 naming feature prompt_logprobs", err)
	}
}
