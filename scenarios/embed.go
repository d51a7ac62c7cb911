// Package scenarios bundles the scenario files and the Mooncake trace, so
// that `kvx compare` runs its demo with nothing beside the binary.
package scenarios

import (
	"embed"
	"os"
	"path/filepath"
)

// FS holds every *.yaml scenario and the traces.
//
//go:embed *.yaml traces/*.jsonl
var FS embed.FS

// Demo is the scenario `kvx compare` runs without --config.
const Demo = "demo.yaml"

// DemoTrace is the trace the demo replays.
const DemoTrace = "traces/mooncake_conversation.jsonl"

// WriteDemo writes the demo scenario and the bundled trace under
// dir/kvx-demo. It returns the scenario's path and the trace's path, which the
// caller passes as workload.trace (the scenario names the trace relative to
// the repository root).
func WriteDemo(dir string) (cfgPath, tracePath string, err error) {
	root := filepath.Join(dir, "kvx-demo")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", "", err
	}
	for name, dst := range map[string]*string{Demo: &cfgPath, DemoTrace: &tracePath} {
		data, err := FS.ReadFile(name)
		if err != nil {
			return "", "", err
		}
		*dst = filepath.Join(root, filepath.Base(name))
		if err := os.WriteFile(*dst, data, 0o644); err != nil {
			return "", "", err
		}
	}
	return cfgPath, tracePath, nil
}
