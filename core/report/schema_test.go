package report

import (
	"bytes"
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
}
