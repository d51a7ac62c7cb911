package report

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// validate checks a JSON report against docs/report.schema.json.
func validate(t *testing.T, what string, data []byte) {
	t.Helper()
	if err := schemaErr(t, data); err != nil {
		t.Errorf("%s does not match docs/report.schema.json: %v", what, err)
	}
}

func schemaErr(t *testing.T, data []byte) error {
	t.Helper()
	c := jsonschema.NewCompiler()
	sch, err := c.Compile("../../docs/report.schema.json")
	if err != nil {
		t.Fatalf("compiling the report schema: %v", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return sch.Validate(doc)
}

// TestSchemaHasTeeth: the schema refuses the old shapes (a bare object, a
// bare list) and a variant without a key scripts read.
func TestSchemaHasTeeth(t *testing.T) {
	for _, bad := range []string{
		`{"variant": "run", "requests": {}}`,
		`[{"variant": "run"}]`,
		`{"schema": "kvx.report/v1", "variants": [{"variant": "run", "status": "finished"}]}`,
		`{"schema": "kvx.report/v2", "variants": []}`,
	} {
		if schemaErr(t, []byte(bad)) == nil {
			t.Errorf("schema accepts %s", bad)
		}
	}
	// A full variant, then each new part broken in one way.
	var buf bytes.Buffer
	d := richSample(true)
	at5 := 5.0
	d.Variants[0].Requests.Records = []RequestRecord{
		{ID: 1, Status: RequestFinished, PromptTokens: 3, Generated: 2},
		{ID: 2, Status: RequestFinished, PromptTokens: 100, ReusedTokens: 64, Generated: 2, Cache: &CacheUse{
			ReusedDevice: 32, ReusedHost: 32, Computed: 36, Reason: "evicted", ReasonTokens: 32, PartialBlockTokens: 4,
			EvictedTier: "host", EvictedBy: "lfu", EvictedAtS: &at5}},
	}
	d.Variants[0].Tokens.PrefixReusedByTier = TierTokens{Device: 32, Host: 32}
	d.Variants[0].Tokens.MissReasons = map[string]MissCount{"evicted": {Requests: 1, Tokens: 32}, "partial_block": {Tokens: 4}}
	if err := WriteJSON(&buf, d); err != nil {
		t.Fatal(err)
	}
	if err := schemaErr(t, buf.Bytes()); err != nil {
		t.Fatalf("the rich sample does not match the schema: %v", err)
	}
	for name, breakIt := range map[string]func(v map[string]any){
		"a record's unknown status": func(v map[string]any) {
			at(v, "requests", "records").([]any)[0].(map[string]any)["status"] = "done"
		},
		"no failures list":  func(v map[string]any) { delete(at(v, "requests").(map[string]any), "failures") },
		"kv usage above 1":  func(v map[string]any) { at(v, "series", "kv_usage").([]any)[0] = 1.5 },
		"a config key typo": func(v map[string]any) { at(v, "resolved_config").(map[string]any)["Max Batch"] = 64 },
		"negative engine_s": func(v map[string]any) { at(v, "throughput").(map[string]any)["engine_s"] = -1 },
		"a series too long": func(v map[string]any) {
			long := make([]any, MaxPoints+1)
			for i := range long {
				long[i] = float64(i)
			}
			at(v, "series").(map[string]any)["t_s"] = long
		},
		"quantiles without p": func(v map[string]any) { delete(at(v, "latency", "quantiles").(map[string]any), "p") },
		"an unknown miss reason": func(v map[string]any) {
			at(v, "tokens", "miss_reasons").(map[string]any)["bad_luck"] = map[string]any{"requests": 1, "tokens": 1}
		},
		"no tiers":                          func(v map[string]any) { delete(at(v, "tokens").(map[string]any), "prefix_reused_by_tier") },
		"a ceiling's hit rate above 1":      func(v map[string]any) { at(v, "tokens", "ceiling", "device").(map[string]any)["hit_rate"] = 1.5 },
		"a ceiling without its infinite":    func(v map[string]any) { delete(at(v, "tokens", "ceiling").(map[string]any), "infinite") },
		"a record's tier":                   func(v map[string]any) { recordCache(v)["evicted_tier"] = "disk" },
		"a record's cache without a reason": func(v map[string]any) { delete(recordCache(v), "miss_reason") },
	} {
		var doc map[string]any
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		breakIt(doc["variants"].([]any)[0].(map[string]any))
		bad, _ := json.Marshal(doc)
		if schemaErr(t, bad) == nil {
			t.Errorf("schema accepts %s", name)
		}
	}
}

// at walks m down the keys.
func at(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		v = v.(map[string]any)[k]
	}
	return v
}

// recordCache is the cache object of the second record of variant v.
func recordCache(v map[string]any) map[string]any {
	return at(v, "requests", "records").([]any)[1].(map[string]any)["cache"].(map[string]any)
}
