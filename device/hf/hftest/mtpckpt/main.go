// Command mtpckpt writes the DeepSeek checkpoints with MTP layers that the
// GPU bundle's mtp step runs (make gpu-bundle calls it): each golden of
// device/hf/testdata's deepseek_v3 and deepseek_v32 plus two MTP layers
// (hftest.WriteMTP), random and quiet (drafts mostly accepted), with the
// golden's prompts.jsonl beside, as core/equiv's TestCheckpointMTP makes
// them.
//
//	go run ./device/hf/hftest/mtpckpt -testdata device/hf/testdata -out DIR
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvx-dev/kvx/device/hf/hftest"
)

func main() {
	testdata := flag.String("testdata", "device/hf/testdata", "the goldens' directory")
	out := flag.String("out", "", "where to write DIR/<name>/ (required)")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: mtpckpt -out DIR [-testdata DIR]")
		os.Exit(2)
	}
	for _, c := range []struct {
		name, fam string
		spec      hftest.MTPSpec
	}{
		{"deepseek_v3_mtp", "deepseek_v3", hftest.MTPSpec{Layers: 2, Seed: 23, Shared: true}},
		{"deepseek_v32_mtp", "deepseek_v32", hftest.MTPSpec{Layers: 2, Seed: 29}},
		{"deepseek_v3_mtp_quiet", "deepseek_v3", hftest.MTPSpec{Layers: 2, Seed: 31, Quiet: 0.002}},
		{"deepseek_v32_mtp_quiet", "deepseek_v32", hftest.MTPSpec{Layers: 2, Seed: 37, Quiet: 0.002}},
	} {
		if err := write(filepath.Join(*testdata, c.fam), filepath.Join(*out, c.name), c.spec); err != nil {
			fmt.Fprintf(os.Stderr, "mtpckpt: %s: %v\n", c.name, err)
			os.Exit(1)
		}
	}
}

func write(src, dir string, s hftest.MTPSpec) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := hftest.WriteMTP(src, dir, s); err != nil {
		return err
	}
	p, err := os.ReadFile(filepath.Join(src, "prompts.jsonl"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "prompts.jsonl"), p, 0o644)
}
