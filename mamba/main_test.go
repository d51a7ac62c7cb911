package mamba_test

import (
	"flag"
	"os"
	"testing"
)

// TestMain keeps the property tests within the package's time budget: 12
// rapid checks unless -rapid.checks says otherwise.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if !set {
		_ = flag.Set("rapid.checks", "12")
	}
	os.Exit(m.Run())
}
