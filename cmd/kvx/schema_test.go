package main

import (
	"bytes"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// validateReport checks a JSON report kvx wrote against
// docs/report.schema.json.
func validateReport(t *testing.T, what string, data []byte) {
	t.Helper()
	sch, err := jsonschema.NewCompiler().Compile("../../docs/report.schema.json")
	if err != nil {
		t.Fatalf("compiling the report schema: %v", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := sch.Validate(doc); err != nil {
		t.Errorf("%s does not match docs/report.schema.json: %v", what, err)
	}
}
