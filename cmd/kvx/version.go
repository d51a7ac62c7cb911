package main

import (
	"fmt"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/core/host"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// version is kvx's release, set at build time with
// -ldflags "-X main.version=v0.3.0"; when empty, the main module's version
// from the build info ("(devel)" for a build from a checkout).
var version = ""

// readBuildInfo is debug.ReadBuildInfo; tests replace it.
var readBuildInfo = debug.ReadBuildInfo

// kvxVersion is the version alone: "v0.3.0", "(devel)".
func kvxVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := readBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// versionText is what kvx --version prints: the version, the plugin
// contract this kvx speaks, and how it was built.
func versionText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kvx %s\n", kvxVersion())
	transports := slices.Sorted(maps.Keys(pluginrpc.HostPlugins()))
	fmt.Fprintf(&b, "plugin contract: cache manager v%d, worker v%d; plugin transport protocol %s, features %s\n",
		kvcache.ProtocolVersion, worker.ProtocolVersion, strings.Trim(fmt.Sprint(transports), "[]"), host.FeatureList(pluginrpc.Current()))
	fmt.Fprintf(&b, "build: %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if bi, ok := readBuildInfo(); ok {
		s := map[string]string{}
		for _, kv := range bi.Settings {
			s[kv.Key] = kv.Value
		}
		if rev := s["vcs.revision"]; rev != "" {
			fmt.Fprintf(&b, ", %s %s", s["vcs"], rev)
			if s["vcs.modified"] == "true" {
				b.WriteString(" (modified)")
			}
			if t := s["vcs.time"]; t != "" {
				fmt.Fprintf(&b, " of %s", t)
			}
		} else {
			b.WriteString(", vcs revision not recorded (built with -buildvcs=false)")
		}
	}
	b.WriteString("\n")
	return b.String()
}
