package pluginrpc

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// wire marshals m and decodes the bytes into a fresh message of its type,
// so round trips cover the encoding, not just the converters.
func wire[M proto.Message](t fataler, m M) M {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("proto.Marshal(%T): %v", m, err)
	}
	out := m.ProtoReflect().New().Interface().(M)
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatalf("proto.Unmarshal(%T): %v", m, err)
	}
	return out
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// fataler is what testing.TB and *rapid.T have in common here.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// mustFrom adapts a decoder that can fail; the test panics on error, which
// fails the round trip (a valid encoding must always decode).
func mustFrom[M, T any](from func(M) (T, error)) func(M) T {
	return func(m M) T { return must(from(m)) }
}

// converter round-trips one contract type through its message and the wire.
type converter struct {
	name string
	// trip converts v (of the contract type) to its message, through the
	// wire, and back.
	trip func(t fataler, v any) any
	// fromNil converts a nil message.
	fromNil func() any
	// zero is the zero value of the contract type.
	zero any
	// full sets every field.
	full any
	// gen draws a random value of the contract type.
	gen *rapid.Generator[any]
}

func conv[T, M any, PM interface {
	*M
	proto.Message
}](name string, full T, to func(T) PM, from func(PM) T) converter {
	return converter{
		name:    name,
		trip:    func(t fataler, v any) any { return from(wire(t, to(v.(T)))) },
		fromNil: func() any { return from(nil) },
		zero:    *new(T),
		full:    full,
		gen:     rapid.Make[T]().AsAny(),
	}
}

// moved carries the two results of Suspend and Resume as one value.
type moved struct {
	OK     []bool
	Copies []kvcache.Copy
}

var converters = []converter{
	conv("kvcache.Info", fullInfo, toProtoManagerInfo, fromProtoManagerInfo),
	conv("kvcache.Capabilities", fullInfo.Capabilities, toProtoCapabilities, fromProtoCapabilities),
	conv("kvcache.SnapshotConfig", fullConfig.Snapshots, toProtoSnapshotConfig, fromProtoSnapshotConfig),
	conv("kvcache.Config", fullConfig,
		func(c kvcache.Config) *kvxpb.ManagerConfig { return must(toProtoManagerConfig(c)) },
		func(p *kvxpb.ManagerConfig) kvcache.Config { return must(fromProtoManagerConfig(p)) }),
	conv("kvcache.Pool", fullLayout.Pools[0],
		func(p kvcache.Pool) *kvxpb.Pool { m := new(kvxpb.Pool); fillProtoPool(m, &p); return m }, fromProtoPool),
	conv("kvcache.Layout", fullLayout, toProtoLayout, fromProtoLayout),
	conv("[]kvcache.LookupItem", fullLookupItems,
		func(items []kvcache.LookupItem) *kvxpb.LookupRequest { return toProtoLookupRequest(items, true, false) }, mustFrom(fromProtoLookupRequest)),
	conv("[]kvcache.LookupItem, raw tokens", fullLookupItems,
		func(items []kvcache.LookupItem) *kvxpb.LookupRequest { return toProtoLookupRequest(items, true, true) }, mustFrom(fromProtoLookupRequest)),
	conv("[]kvcache.Explanation", fullExplanations, toProtoExplainResponse, mustFrom(fromProtoExplainResponse)),
	conv("lookup tokens", []int{0, 512, 1 << 40}, toProtoLookupResponse, fromProtoLookupResponse),
	conv("[]kvcache.ReserveItem", fullReserveItems,
		func(items []kvcache.ReserveItem) *kvxpb.ReserveRequest { return toProtoReserveRequest(items, false) }, mustFrom(fromProtoReserveRequest)),
	conv("[]kvcache.ReserveItem, raw tokens", fullReserveItems,
		func(items []kvcache.ReserveItem) *kvxpb.ReserveRequest { return toProtoReserveRequest(items, true) }, mustFrom(fromProtoReserveRequest)),
	conv("[]kvcache.ForkItem", fullForkItems, toProtoForkRequest, mustFrom(fromProtoForkRequest)),
	conv("[]kvcache.TableDelta", fullTables,
		func(ds []kvcache.TableDelta) *kvxpb.TableDeltas {
			return toProtoTableDeltas(1, func(int) []kvcache.TableDelta { return ds })
		},
		func(p *kvxpb.TableDeltas) (out []kvcache.TableDelta) {
			must(0, fromProtoTableDeltas("test", p, 1, func(_ int, ds []kvcache.TableDelta) { out = ds }))
			return out
		}),
	conv("[]kvcache.Grant", fullGrants, toProtoReserveResponse, mustFrom(fromProtoReserveResponse)),
	conv("[]kvcache.SeqID", []kvcache.SeqID{0, 1, 1<<64 - 1}, toProtoSeqs, fromProtoSeqs),
	conv("[]kvcache.CommitItem", []kvcache.CommitItem{{Seq: 3, Accepted: 2}, {Seq: 4, Accepted: 1}},
		toProtoCommitRequest, mustFrom(fromProtoCommitRequest)),
	conv("kvcache.CommitResult", kvcache.CommitResult{Copies: fullCopies}, toProtoCommitResult, mustFrom(fromProtoCommitResult)),
	conv("suspend/resume result", moved{OK: []bool{true, false}, Copies: fullCopies},
		func(m moved) *kvxpb.MoveResult { return toProtoMoveResult(m.OK, m.Copies) },
		func(p *kvxpb.MoveResult) moved {
			ok, c, err := fromProtoMoveResult(p)
			return moved{ok, must(c, err)}
		}),
	conv("kvcache.PoolStats", fullStats.Pools[0],
		func(s kvcache.PoolStats) *kvxpb.PoolStats {
			m := new(kvxpb.PoolStats)
			fillProtoPoolStats(m, &s)
			return m
		},
		fromProtoPoolStats),
	conv("kvcache.SnapshotStats", fullStats.Snapshots, toProtoSnapshotStats, fromProtoSnapshotStats),
	conv("kvcache.Stats", fullStats, toProtoStats, fromProtoStats),
	conv("kvcache.InspectOptions", kvcache.InspectOptions{Tables: true, CheckTables: true}, toProtoInspectOptions, fromProtoInspectOptions),
	conv("kvcache.SeqState", fullSnapshot.Seqs[0],
		func(s kvcache.SeqState) *kvxpb.SeqState { return toProtoSeqState(&s) }, fromProtoSeqState),
	conv("kvcache.Snapshot", fullSnapshot, toProtoSnapshot, mustFrom(fromProtoSnapshot)),
	conv("worker.Info", fullWorkerInfo, toProtoWorkerInfo, fromProtoWorkerInfo),
	conv("spec.Hardware", fullHardware, toProtoHardware, fromProtoHardware),
	// nil (no calibration) travels inside spec.Hardware, whose zero and
	// random values have it.
	conv("spec.SimCalibration", fullSimCalibration,
		func(c spec.SimCalibration) *kvxpb.SimCalibration { return toProtoSimCalibration(&c) },
		func(p *kvxpb.SimCalibration) spec.SimCalibration {
			if c := fromProtoSimCalibration(p); c != nil {
				return *c
			}
			return spec.SimCalibration{}
		}),
	conv("worker.Config", fullWorkerConfig,
		func(c worker.Config) *kvxpb.WorkerConfig { return must(toProtoWorkerConfig(c)) },
		func(p *kvxpb.WorkerConfig) worker.Config { return must(fromProtoWorkerConfig(p)) }),
	conv("worker.Setup", worker.Setup{DeviceBytes: 1 << 30, Notes: []string{"a", "b"}}, toProtoSetup, fromProtoSetup),
	conv("worker.Batch", fullBatch, func(b worker.Batch) *kvxpb.Batch { return toProtoBatch(&b) }, mustFrom(fromProtoBatch)),
	conv("worker.Result", fullResult, func(r worker.Result) *kvxpb.Result { return toProtoResult(&r) }, mustFrom(fromProtoResult)),
	conv("[]kvcache.Copy", fullCopies, toProtoCopyBlocksRequest, mustFrom(fromProtoCopyBlocksRequest)),
	conv("[]kvcache.Event", fullEvents, toProtoEvents, fromProtoEvents),
}

// TestConvertRoundTrip checks, for every converter, that a value with every
// field set and the zero value survive contract type -> message -> bytes ->
// message -> contract type, and that a nil message converts to the zero value.
func TestConvertRoundTrip(t *testing.T) {
	for _, c := range converters {
		t.Run(c.name, func(t *testing.T) {
			if unset := unsetFields(c.full); len(unset) > 0 {
				t.Fatalf("full test value leaves fields unset: %v", unset)
			}
			for _, tc := range []struct {
				name string
				v    any
			}{{"full", c.full}, {"zero", c.zero}} {
				if got, want := c.trip(t, tc.v), normalize(tc.v); !deepEqual(got, want) {
					t.Errorf("%s: round trip =\n%#v\nwant\n%#v", tc.name, got, want)
				}
			}
			if got := c.fromNil(); !deepEqual(got, normalize(c.zero)) {
				t.Errorf("from nil message = %#v, want zero %#v", got, c.zero)
			}
		})
	}
}

// TestConvertRoundTripRandom draws random values of every contract type
// (empty and nil slices, extreme integers, any valid strings) and checks the
// round trip.
func TestConvertRoundTripRandom(t *testing.T) {
	for _, c := range converters {
		t.Run(c.name, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				v := c.gen.Draw(rt, "v")
				if got, want := c.trip(rt, v), normalize(v); !deepEqual(got, want) {
					rt.Fatalf("round trip =\n%#v\nwant\n%#v", got, want)
				}
			})
		})
	}
}

// TestConvertDoesNotShareCapacity checks that slices carved from one
// allocation cannot clobber their neighbours when a caller appends.
func TestConvertDoesNotShareCapacity(t *testing.T) {
	gs := must(fromProtoReserveResponse(wire(t, toProtoReserveResponse(fullGrants))))
	before := normalize(gs[1])
	gs[0].Tables = append(gs[0].Tables, kvcache.TableDelta{Pool: 99})
	gs[0].Tables[0].Blocks = append(gs[0].Tables[0].Blocks, 99)
	gs[0].Copies = append(gs[0].Copies, kvcache.Copy{SrcPool: 99})
	if !deepEqual(gs[1], before) {
		t.Errorf("appending to grant 0 changed grant 1: %#v, want %#v", gs[1], before)
	}
}

func TestConfigBadJSON(t *testing.T) {
	if _, err := fromProtoManagerConfig(&kvxpb.ManagerConfig{LayersJson: []byte("{")}); kvcache.KindOf(err) != kvcache.KindInvalidConfig {
		t.Errorf("fromProtoManagerConfig(bad layers_json) error = %v, want kind %v", err, kvcache.KindInvalidConfig)
	}
	if _, err := fromProtoWorkerConfig(&kvxpb.WorkerConfig{ModelJson: []byte(`{"hidden":"x"}`)}); kvcache.KindOf(err) != kvcache.KindInvalidConfig {
		t.Errorf("fromProtoWorkerConfig(bad model_json) error = %v, want kind %v", err, kvcache.KindInvalidConfig)
	}
}

// TestModelTravelsAsSpecJSON pins the documented wire form of spec values:
// the JSON encoding of the plugins/v1/spec types.
func TestModelTravelsAsSpecJSON(t *testing.T) {
	m := must(toProtoWorkerConfig(worker.Config{Model: spec.Model{Name: "m", Hidden: 8, Layers: []spec.Layer{{Index: 0, Mixer: spec.MixerGQA}}}}))
	want := `{"name":"m","arch":"","hidden":8,"vocab":0,"max_position":0,"heads":0,"layers":[{"index":0,"mixer":"gqa"}]}`
	if got := string(m.GetModelJson()); got != want {
		t.Errorf("model_json = %s, want %s", got, want)
	}
}

// TestMalformedColumns: a columnar message whose columns do not line up is
// rejected with KindInvalidArg naming the column, never decoded wrongly.
func TestMalformedColumns(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"fork columns of two lengths", second(fromProtoForkRequest(&kvxpb.ForkRequest{Parent: []uint64{1, 2}, Child: []uint64{3}})), "2 parents and 1 children"},
		{"short optional column", second(fromProtoReserveRequest(&kvxpb.ReserveRequest{Seq: []uint64{1, 2}, Draft: []int64{1}})), "draft"},
		{"prompt lengths too long", second(fromProtoReserveRequest(&kvxpb.ReserveRequest{Seq: []uint64{1}, PromptLen: []int64{3}, Prompt: []int32{1, 2}})), "prompt_len"},
		{"prompt without lengths", second(fromProtoReserveRequest(&kvxpb.ReserveRequest{Seq: []uint64{1}, Prompt: []int32{1}})), "prompt_len"},
		{"negative length", second(fromProtoReserveRequest(&kvxpb.ReserveRequest{Seq: []uint64{1, 2}, PromptLen: []int64{-1, 2}, Prompt: []int32{1}})), "prompt_len[0] = -1"},
		{"table item out of range", second(fromProtoReserveResponse(&kvxpb.ReserveResponse{Seq: []uint64{1},
			Tables: &kvxpb.TableDeltas{Item: []int32{1}}})), "tables.item[0] = 1"},
		{"table items decreasing", second(fromProtoReserveResponse(&kvxpb.ReserveResponse{Seq: []uint64{1, 2},
			Tables: &kvxpb.TableDeltas{Item: []int32{1, 0}}})), "tables.item[1] = 0"},
		{"table blocks unsplit", second(fromProtoReserveResponse(&kvxpb.ReserveResponse{Seq: []uint64{1},
			Tables: &kvxpb.TableDeltas{Item: []int32{0}, Blocks: []int32{4}}})), "tables.len"},
		{"table values without items", second(fromProtoReserveResponse(&kvxpb.ReserveResponse{Seq: []uint64{1},
			Tables: &kvxpb.TableDeltas{Pool: []int64{1}}})), "no item column"},
		{"copy item out of range", second(fromProtoReserveResponse(&kvxpb.ReserveResponse{Seq: []uint64{1},
			Copies: &kvxpb.Copies{SrcPool: []int64{1}, Item: []int32{5}}})), "copies.item[0] = 5"},
		{"copies without src_pool", second(fromProtoCommitResult(&kvxpb.CommitResult{Copies: &kvxpb.Copies{DstPool: []int64{1}}})), "no src_pool"},
		{"copy column short", second(fromProtoCommitResult(&kvxpb.CommitResult{Copies: &kvxpb.Copies{SrcPool: []int64{1, 2}, DstBlock: []int32{1}}})), "copies.dst_block"},
		{"reasons unpaired", second(fromProtoReserveResponse(&kvxpb.ReserveResponse{Seq: []uint64{1}, Reason: []string{"x"}})), "reason_item"},
		{"reasons repeated", second(fromProtoReserveResponse(&kvxpb.ReserveResponse{Seq: []uint64{1, 2},
			ReasonItem: []int32{1, 1}, Reason: []string{"x", "y"}})), "reason_item[1] = 1"},
		{"salts unpaired", second(fromProtoReserveRequest(&kvxpb.ReserveRequest{Seq: []uint64{1}, Salt: []string{"x"}})), "salt_item"},
		{"salt item out of range", second(fromProtoReserveRequest(&kvxpb.ReserveRequest{Seq: []uint64{1},
			SaltItem: []int32{1}, Salt: []string{"x"}})), "salt_item[0] = 1"},
		{"commit accepted short", second(fromProtoCommitRequest(&kvxpb.CommitRequest{Seq: []uint64{1, 2}, Accepted: []int64{1}})), "accepted"},
		{"batch tables without items", second(fromProtoBatch(&kvxpb.Batch{Tables: &kvxpb.TableDeltas{Item: []int32{0}}})), "tables"},
		{"batch tokens unsplit", second(fromProtoBatch(&kvxpb.Batch{Seq: []uint64{1}, TokensLen: []int64{1}, Tokens: []int32{1, 2}})), "tokens_len"},
		{"result logits unsplit", second(fromProtoResult(&kvxpb.Result{Seq: []uint64{1}, Logits: []float32{1}})), "logits_len"},
		{"batch top_logprobs short", second(fromProtoBatch(&kvxpb.Batch{Seq: []uint64{1, 2}, TopLogprobs: []int64{5}})), "top_logprobs"},
		{"result top logprobs unsplit", second(fromProtoResult(&kvxpb.Result{Seq: []uint64{1}, TopLogprobsN: []int64{1}, TopLogprobIds: []int32{3}})), "top_logprobs_len"},
		{"result top logprob ids short", second(fromProtoResult(&kvxpb.Result{Seq: []uint64{1}, TopLogprobsLen: []int64{1},
			TopLogprobsN: []int64{2}, TopLogprobIds: []int32{3}})), "top_logprob_ids"},
		{"result top logprobs negative", second(fromProtoResult(&kvxpb.Result{Seq: []uint64{1}, TopLogprobsLen: []int64{-1}})), "top_logprobs_len[0] = -1"},
	} {
		if kvcache.KindOf(tc.err) != kvcache.KindInvalidArg || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: error %v, want kind %v mentioning %q", tc.name, tc.err, kvcache.KindInvalidArg, tc.want)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// TestSnapshotColumns: a snapshot without tables (the one that goes with
// every step) crosses as columns and comes back equal, zero columns and
// all; malformed columns are refused naming the column.
func TestSnapshotColumns(t *testing.T) {
	snap := kvcache.Snapshot{
		Pools: fullStats.Pools,
		Seqs: []kvcache.SeqState{
			{Seq: 5, History: 100, Capacity: 128, Reserved: 2, Draft: 1, Hold: 4096, Suspended: true, Blocks: []int{2, 1}},
			{Seq: 9, History: 7, Capacity: 64, Blocks: []int{1, 0}},
			{Seq: 1 << 63, History: 1 << 40, Capacity: 1 << 41, Blocks: []int{3, 3}},
		},
		Violations: []string{"x"},
	}
	m := toProtoSnapshot(snap)
	if m.GetSeqColumns() == nil || len(m.GetSeqs()) != 0 {
		t.Fatalf("a snapshot without tables went as %d messages, columns %v", len(m.GetSeqs()), m.GetSeqColumns() != nil)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	back := new(kvxpb.Snapshot)
	if err := proto.Unmarshal(b, back); err != nil {
		t.Fatal(err)
	}
	got, err := fromProtoSnapshot(back)
	if err != nil || !deepEqual(got, snap) {
		t.Fatalf("round trip = %+v, %v\nwant %+v", got, err, snap)
	}
	// Only the first sequence has optional fields: without it those columns are empty.
	if m := toProtoSnapshot(kvcache.Snapshot{Seqs: snap.Seqs[1:]}); m.GetSeqColumns().GetReserved() != nil || m.GetSeqColumns().GetSuspended() != nil {
		t.Errorf("all-zero optional columns were sent: %+v", m.GetSeqColumns())
	}
	for _, c := range []struct {
		name   string
		mutate func(c *kvxpb.SeqColumns)
		want   string
	}{
		{"short history", func(c *kvxpb.SeqColumns) { c.History = c.History[:2] }, "history"},
		{"short optional", func(c *kvxpb.SeqColumns) { c.Hold = c.Hold[:1] }, "column hold"},
		{"short blocks", func(c *kvxpb.SeqColumns) { c.Blocks = c.Blocks[:5] }, "blocks"},
	} {
		m := toProtoSnapshot(snap)
		c.mutate(m.SeqColumns)
		if _, err := fromProtoSnapshot(m); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", c.name, err, c.want)
		}
	}
}

// TestTopLogprobsConvert: Output.TopLogprobs, the field added to the
// contract for kvx generate, survives the Result's columns in every shape:
// outputs with and without lists, empty lists, zero ids and log-probabilities
// (trimmed columns), and ragged lists.
func TestTopLogprobsConvert(t *testing.T) {
	type lp = worker.TokenLogprob
	tl := func(id int32, v float64) lp { return lp{ID: id, Logprob: v} }
	for _, tc := range []struct {
		name string
		outs []worker.Output
	}{
		{"none", []worker.Output{{Seq: 1, Tokens: []int32{4}}}},
		{"one list", []worker.Output{{Seq: 1, Tokens: []int32{4}, TopLogprobs: [][]lp{{tl(4, -0.1), tl(2, -3)}}}}},
		{"per accepted draft", []worker.Output{{Seq: 1, Tokens: []int32{4, 5, 6},
			TopLogprobs: [][]lp{{tl(4, -0.1)}, {tl(5, -0.2)}, {tl(6, -0.3)}}}}},
		{"second output only", []worker.Output{{Seq: 1, Tokens: []int32{4}}, {Seq: 2, Tokens: []int32{7}, TopLogprobs: [][]lp{{tl(7, -1), tl(0, -2)}}}}},
		{"zero ids and logprobs", []worker.Output{{Seq: 1, Tokens: []int32{0}, TopLogprobs: [][]lp{{tl(0, 0)}}}}},
		{"empty lists", []worker.Output{{Seq: 1, Tokens: []int32{3, 4}, TopLogprobs: [][]lp{nil, nil}}}},
		{"ragged", []worker.Output{{Seq: 1, Tokens: []int32{3, 4}, TopLogprobs: [][]lp{{tl(3, -1)}, nil}},
			{Seq: 2, Tokens: []int32{9}, TopLogprobs: [][]lp{{tl(9, -0.5), tl(8, -0.75), tl(7, -0.875)}}}}},
	} {
		r := worker.Result{Outputs: tc.outs}
		got, err := fromProtoResult(wire(t, toProtoResult(&r)))
		if err != nil {
			t.Errorf("%s: fromProtoResult: %v", tc.name, err)
			continue
		}
		if want := normalize(r); !deepEqual(got, want) {
			t.Errorf("%s: round trip = %+v, want %+v", tc.name, got.Outputs, want.Outputs)
		}
	}
}
