package pluginrpc

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"

	"google.golang.org/grpc"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
)

// Versioning: the wire tells the truth.
//
// Two numbers and one list say what a build of this package speaks:
//
//   - Protocol, the wire protocol: go-plugin's handshake version, so a peer
//     of another protocol is refused before any call. It changes whenever the
//     wire changes meaning: a field, RPC or message removed, renumbered or
//     retyped, or an existing field read differently.
//   - Features, named additive changes within a protocol: a new field, RPC
//     or message that a peer without it ignores or never calls. Each is a
//     Feature entry naming the proto elements it adds. A peer ignores the
//     names it does not know; a name in Required that the peer lacks is
//     refused.
//   - kvcache.ProtocolVersion / worker.ProtocolVersion (Info.Protocols), the
//     Go contract's major version (the v1 in the import path).
//
// Both sides say theirs in the Contract service's Hello right after the
// handshake, and Negotiate decides, the same on either side. TestWire holds
// Protocol and Features to kvx.proto: it compares every field and RPC with
// testdata/wire.txt, the fingerprint of the protocol's wire, and says what
// to do when they differ (docs/plugin-authors.md, "Changing the wire").

// Protocol is the wire protocol of this build: the go-plugin handshake
// version of every kvx plugin. 3: protocol 2 plus the Contract service;
// Inspect's shallow snapshots as SeqColumns, and the Linux data plane in
// shared memory (frame version 3), both of which changed the wire while
// every peer still said 2 (issue 16's false "manager invariant violated":
// a kvx from before SeqColumns ignores them and sees a snapshot without
// the sequences it holds).
const Protocol = 3

// Feature names one additive change of the wire within Protocol.
type Feature string

// The features of this build.
const (
	// FeatureTopLogprobs: Batch.top_logprobs asks the last stage for the K
	// most likely tokens of each sampled token; Result.top_logprobs_*
	// carry them. A worker without it would ignore the column, so the
	// client refuses such a batch instead of returning no logprobs.
	FeatureTopLogprobs Feature = "top_logprobs"
	// FeatureCacheSalt: LookupItem.cache_salt and ReserveRequest's salt
	// columns carry a request's cache_salt, and Capabilities.cache_salt
	// says the manager keys its prefix cache by it. The engine sends a
	// salted request only to a manager that says so, so a manager without
	// it never shares blocks across salts by ignoring them.
	FeatureCacheSalt Feature = "cache_salt"
	// FeatureKVEvents: ManagerConfig.kv_events asks the manager to record
	// block stores and removals, CacheManager.Events drains them, and
	// Capabilities.kv_events says it can.
	FeatureKVEvents Feature = "kv_events"
	// FeatureSimCalibration: Hardware.calibration carries the sim cost
	// model's calibration (kvx calibrate) to the worker. A worker without
	// it would run the datasheet roofline while the report names the
	// calibration, so the client refuses to configure one with it.
	FeatureSimCalibration Feature = "sim_calibration"
	// FeatureExplain: LookupRequest.explain asks for kvcache.Explainer's
	// answer, whose columns LookupResponse gains; LookupItem.now is the
	// manager's clock; ReserveResponse.host_reused splits a grant's reuse
	// by tier; Capabilities.explain says the manager explains. The engine
	// asks only a manager that says so (an older one would answer a plain
	// Lookup, read as "unknown" reasons).
	FeatureExplain Feature = "explain"
	// FeatureRetention: ReserveRequest's priority, priority_duration and
	// now columns (a request's retention priority), ManagerConfig's
	// eviction_policy, and Capabilities' retention and eviction_policies.
	// The engine configures a policy other than lru only on a manager
	// that lists it.
	FeatureRetention Feature = "retention"
	// FeatureCopyLatency: Hardware.copy_latency, the fixed cost of one
	// block-copy transfer, which the sim device charges once per run of
	// contiguous copies. A sim worker without it would charge copies their
	// bytes only, so the client refuses to configure one with a latency.
	FeatureCopyLatency Feature = "copy_latency"
	// FeatureComputeDtype: WorkerConfig.dtype, the compute dtype of a
	// device with real math (worker.Config.Dtype). A worker without it
	// would run float32 while the report says bfloat16, so the client
	// refuses to configure one with a dtype other than float32.
	FeatureComputeDtype Feature = "compute_dtype"
	// FeatureItemLogits: Batch.logits, which items want their logits back
	// (worker.Item.Logits). A worker without it returns every sampled
	// item's logits, which the host ignores when it did not ask.
	FeatureItemLogits Feature = "item_logits"
	// FeatureSampling: Batch.sampling carries an item's worker.Sampling
	// (temperature, top_p, top_k, min_p, seed, penalties, min_tokens) and
	// Batch.logprobs asks for the sampled tokens' log-probabilities, which
	// Result.logprobs carries. A worker without it would sample greedily
	// and return no logprobs, so the client refuses such a batch.
	FeatureSampling Feature = "sampling"
	// FeatureFork: the CacheManager.Fork RPC (kvcache.Forker) and
	// Capabilities.fork. A plugin without it never says Fork, so the host
	// runs the n sequences of one request as separate requests; the client
	// refuses a Fork call to it.
	FeatureFork Feature = "fork"
	// FeaturePromptLogprobs: Batch.prompt_logprobs, prompt_top_logprobs
	// and next ask the last stage for a prefill item's prompt rows
	// (worker.Item.PromptLogprobs), which Result.prompt_* carry. A worker
	// without it would return none, so the client refuses such a batch,
	// naming the feature, for the asking items alone.
	FeaturePromptLogprobs Feature = "prompt_logprobs"
	// FeatureRawTokens: LookupItem.prompt_raw and ReserveRequest.prompt_raw
	// carry prompts as little-endian int32s instead of packed varints (a
	// copy each way instead of an encode and a decode a token: a 256k-token
	// prompt sent at every admission round was most of a long-prompt
	// run's host time as plugins). The client sends them only to a plugin
	// that lists it; a plugin reads either form.
	FeatureRawTokens Feature = "raw_tokens"
)

// featureDef is a feature and the proto elements it adds: full names of
// fields ("kvx.v1.Batch.top_logprobs"), of whole messages, enums, services
// or RPCs ("kvx.v1.Worker.Forward").
type featureDef struct {
	Name     Feature
	Adds     []string
	Required bool // this build refuses a peer without it
}

// features is every feature of this build, in the order they were added.
// A new field, RPC or message of kvx.proto goes here (TestWire says so).
var features = []featureDef{
	{Name: FeatureTopLogprobs, Adds: []string{
		"kvx.v1.Batch.top_logprobs",
		"kvx.v1.Result.top_logprobs_len", "kvx.v1.Result.top_logprobs_n",
		"kvx.v1.Result.top_logprob_ids", "kvx.v1.Result.top_logprobs",
	}},
	{Name: FeatureCacheSalt, Adds: []string{
		"kvx.v1.Capabilities.cache_salt",
		"kvx.v1.LookupItem.cache_salt",
		"kvx.v1.ReserveRequest.salt_item", "kvx.v1.ReserveRequest.salt",
	}},
	{Name: FeatureKVEvents, Adds: []string{
		"kvx.v1.Capabilities.kv_events",
		"kvx.v1.ManagerConfig.kv_events",
		"kvx.v1.Event", "kvx.v1.EventList", "kvx.v1.EventsRequest",
		"kvx.v1.CacheManager.Events",
	}},
	{Name: FeatureSimCalibration, Adds: []string{
		"kvx.v1.Hardware.calibration", "kvx.v1.SimCalibration", "kvx.v1.KernelClassScale",
	}},
	{Name: FeatureExplain, Adds: []string{
		"kvx.v1.Capabilities.explain",
		"kvx.v1.LookupItem.now", "kvx.v1.LookupRequest.explain",
		"kvx.v1.LookupResponse.host_tokens", "kvx.v1.LookupResponse.miss",
		"kvx.v1.LookupResponse.evicted_tier", "kvx.v1.LookupResponse.evicted_by", "kvx.v1.LookupResponse.evicted_at",
		"kvx.v1.ReserveResponse.host_reused",
	}},
	{Name: FeatureRetention, Adds: []string{
		"kvx.v1.Capabilities.retention", "kvx.v1.Capabilities.eviction_policies",
		"kvx.v1.ManagerConfig.eviction_policy",
		"kvx.v1.ReserveRequest.priority", "kvx.v1.ReserveRequest.priority_duration", "kvx.v1.ReserveRequest.now",
	}},
	{Name: FeatureCopyLatency, Adds: []string{"kvx.v1.Hardware.copy_latency"}},
	{Name: FeatureComputeDtype, Adds: []string{"kvx.v1.WorkerConfig.dtype"}},
	{Name: FeatureItemLogits, Adds: []string{"kvx.v1.Batch.logits"}},
	{Name: FeatureSampling, Adds: []string{
		"kvx.v1.Batch.logprobs", "kvx.v1.Batch.sampling", "kvx.v1.Sampling",
		"kvx.v1.Result.logprobs_len", "kvx.v1.Result.logprobs",
	}},
	{Name: FeatureFork, Adds: []string{
		"kvx.v1.Capabilities.fork", "kvx.v1.ForkRequest", "kvx.v1.CacheManager.Fork",
	}},
	{Name: FeaturePromptLogprobs, Adds: []string{
		"kvx.v1.Batch.prompt_logprobs", "kvx.v1.Batch.prompt_top_logprobs", "kvx.v1.Batch.next",
		"kvx.v1.Result.prompt_seq", "kvx.v1.Result.prompt_len", "kvx.v1.Result.prompt_logprobs",
		"kvx.v1.Result.prompt_top_n", "kvx.v1.Result.prompt_top_ids", "kvx.v1.Result.prompt_top_logprobs",
		"kvx.v1.Result.prompt_top_len",
	}},
	{Name: FeatureRawTokens, Adds: []string{"kvx.v1.LookupItem.prompt_raw", "kvx.v1.ReserveRequest.prompt_raw"}},
}

// Contract is what one side speaks.
type Contract struct {
	Protocol int
	Features []Feature // what it implements
	Required []Feature // what it refuses to work without
	Build    string    // the kvx module version it was built from ("" when unknown)
}

// Current returns what this build speaks.
func Current() Contract {
	c := Contract{Protocol: Protocol, Build: moduleVersion()}
	for _, f := range features {
		c.Features = append(c.Features, f.Name)
		if f.Required {
			c.Required = append(c.Required, f.Name)
		}
	}
	return c
}

const modulePath = "github.com/kvx-dev/kvx"

// moduleVersion is the version of the kvx module this binary was built
// from: the main module's for kvx itself and the in-tree plugins, the
// dependency's for a plugin in its own module.
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	if bi.Main.Path == modulePath {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == modulePath {
			if d.Replace != nil {
				return d.Version + " => " + d.Replace.Path
			}
			return d.Version
		}
	}
	return ""
}

// String is how messages name a side: "protocol 3, features
// [top_logprobs], requires [], built from kvx (devel)".
func (c Contract) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "protocol %d", c.Protocol)
	switch {
	case c.Protocol < 3:
		b.WriteString(" (protocols before 3 exchange no feature list)")
	case c.Features == nil && c.Required == nil && c.Build == "":
		b.WriteString(" (features unknown: known from the handshake alone)")
	default:
		fmt.Fprintf(&b, ", features %v, requires %v", c.Features, c.Required)
	}
	if c.Build != "" {
		fmt.Fprintf(&b, ", built from kvx %s", c.Build)
	}
	return b.String()
}

// Has reports whether c offers f.
func (c Contract) Has(f Feature) bool { return slices.Contains(c.Features, f) }

// ErrMismatch is wrapped by every MismatchError.
var ErrMismatch = errors.New("plugin contract mismatch")

// MismatchError is a host and a plugin that cannot work together: another
// protocol, or a required feature the other lacks. Its text names both
// sides and what to rebuild.
type MismatchError struct {
	Host, Plugin Contract
	Missing      []Feature // required by one side, lacked by the other
	ByPlugin     bool      // Missing is what the plugin requires and the host lacks
}

func (e *MismatchError) Error() string {
	var why, fix string
	switch {
	case e.Plugin.Protocol < e.Host.Protocol:
		why = "the plugin is older than this kvx"
		fix = "rebuild the plugin against this kvx's plugins/sdk"
	case e.Plugin.Protocol > e.Host.Protocol:
		why = "the plugin is newer than this kvx"
		fix = fmt.Sprintf("use a kvx that speaks protocol %d, or rebuild the plugin against this kvx's plugins/sdk", e.Plugin.Protocol)
	case e.ByPlugin:
		why = fmt.Sprintf("the plugin requires %s, which this kvx lacks", featureList(e.Missing))
		fix = "use a kvx built from the plugin's kvx version or later, or rebuild the plugin against this kvx's plugins/sdk"
	default:
		why = fmt.Sprintf("this kvx requires %s, which the plugin lacks", featureList(e.Missing))
		fix = "rebuild the plugin against this kvx's plugins/sdk"
	}
	return fmt.Sprintf("%s (plugin: %v; kvx: %v); %s", why, e.Plugin, e.Host, fix)
}

func (e *MismatchError) Unwrap() error { return ErrMismatch }

func featureList(fs []Feature) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = string(f)
	}
	if len(s) == 1 {
		return "feature " + s[0]
	}
	return "features " + strings.Join(s, ", ")
}

// Negotiate decides whether host and plugin work together and returns the
// features both offer, in host's order. Features only one side knows are
// ignored unless the other requires them. The error is a *MismatchError.
func Negotiate(host, plugin Contract) ([]Feature, error) {
	if host.Protocol != plugin.Protocol {
		return nil, &MismatchError{Host: host, Plugin: plugin}
	}
	if m := missing(host.Required, plugin.Features); len(m) > 0 {
		return nil, &MismatchError{Host: host, Plugin: plugin, Missing: m}
	}
	if m := missing(plugin.Required, host.Features); len(m) > 0 {
		return nil, &MismatchError{Host: host, Plugin: plugin, Missing: m, ByPlugin: true}
	}
	var both []Feature
	for _, f := range host.Features {
		if slices.Contains(plugin.Features, f) {
			both = append(both, f)
		}
	}
	return both, nil
}

func missing(required, offered []Feature) []Feature {
	var m []Feature
	for _, f := range required {
		if !slices.Contains(offered, f) {
			m = append(m, f)
		}
	}
	return m
}

func toSide(c Contract) *kvxpb.ContractSide {
	s := &kvxpb.ContractSide{Protocol: uint32(c.Protocol), Build: c.Build}
	for _, f := range c.Features {
		s.Features = append(s.Features, string(f))
	}
	for _, f := range c.Required {
		s.Required = append(s.Required, string(f))
	}
	return s
}

func fromSide(s *kvxpb.ContractSide) Contract {
	c := Contract{Protocol: int(s.GetProtocol()), Build: s.GetBuild()}
	for _, f := range s.GetFeatures() {
		c.Features = append(c.Features, Feature(f))
	}
	for _, f := range s.GetRequired() {
		c.Required = append(c.Required, Feature(f))
	}
	return c
}

// contractServer answers Hello with what the plugin speaks.
type contractServer struct {
	kvxpb.UnimplementedContractServer
	ours Contract
}

func (s contractServer) Hello(context.Context, *kvxpb.ContractSide) (*kvxpb.ContractSide, error) {
	return toSide(s.ours), nil
}

// registerContract registers the Contract service on s once (a plugin set's
// two kinds share one server), answering with c, or Current when nil.
func registerContract(s *grpc.Server, c *Contract) {
	if _, ok := s.GetServiceInfo()[kvxpb.Contract_ServiceDesc.ServiceName]; ok {
		return
	}
	ours := Current()
	if c != nil {
		ours = *c
	}
	kvxpb.RegisterContractServer(s, contractServer{ours: ours})
}

// negotiate says ours to the plugin on f's connection, and on agreement
// keeps the plugin's contract and the features both offer for every
// instance client of the process.
func (f *family) negotiate(ctx context.Context, ours Contract) (Contract, error) {
	resp, err := kvxpb.NewContractClient(f.cc).Hello(ctx, toSide(ours), callOpts...)
	if err != nil {
		return Contract{}, fromStatus(ctx, nil, "Contract.Hello", err, nil)
	}
	theirs := fromSide(resp)
	agreed, err := Negotiate(ours, theirs)
	if err != nil {
		return theirs, err
	}
	f.mu.Lock()
	f.agreed, f.negotiated = agreed, true
	f.mu.Unlock()
	return theirs, nil
}

// has reports whether the plugin offers feature x. A family that did not
// negotiate (TestManagerPair: both ends are this build) has every feature.
func (f *family) has(x Feature) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.negotiated || slices.Contains(f.agreed, x)
}

// Negotiate calls the plugin's Hello with ours and applies Negotiate: on
// agreement the client (and every instance of its process) uses only the
// features both offer. It returns the plugin's contract, also with a
// *MismatchError. core/host calls it once per process, before Info.
func (c *ManagerClient) Negotiate(ctx context.Context, ours Contract) (Contract, error) {
	return c.fam.negotiate(ctx, ours)
}

// Negotiate is ManagerClient.Negotiate for a worker.
func (c *WorkerClient) Negotiate(ctx context.Context, ours Contract) (Contract, error) {
	return c.fam.negotiate(ctx, ours)
}
