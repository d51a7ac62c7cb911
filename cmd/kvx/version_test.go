package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionTextFromBuildInfo: the build line carries the VCS revision,
// its time and whether the tree was modified, from the build info.
func TestVersionTextFromBuildInfo(t *testing.T) {
	defer func(f func() (*debug.BuildInfo, bool)) { readBuildInfo = f }(readBuildInfo)
	readBuildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}}, true
	}
	got := versionText()
	for _, w := range []string{"kvx v0.3.0\n", "git 0123abcd (modified) of 2026-12-01T10:00:00Z", "plugin contract",
		"transport protocol 3, features top_logprobs"} {
		if !strings.Contains(got, w) {
			t.Errorf("versionText() = %q, lacks %q", got, w)
		}
	}
}
