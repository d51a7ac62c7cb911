package cachemgrv2

import (
	"flag"
	"os"
	"testing"
)

// TestMain gives the property test longer runs than rapid's defaults (30
// actions per case build up too little state to exercise eviction and the
// host tier) unless -rapid.checks or -rapid.steps are given. For a deep run:
// go test -run TestProperty -rapid.checks=3000 -rapid.steps=300 (about 20 s).
func TestMain(m *testing.M) {
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["rapid.checks"] && !set["rapid.steps"] {
		flag.Set("rapid.checks", "300")
		flag.Set("rapid.steps", "150")
	}
	os.Exit(m.Run())
}
