package pluginrpc

import (
	"strings"
	"testing"
)

func TestReattachEnv(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"kvx-fifo", "KVX_REATTACH_FIFO"},
		{"./bin/kvx-fifo", "KVX_REATTACH_FIFO"},
		{"/opt/kvx/kvx-cachemgr-v1", "KVX_REATTACH_CACHEMGR_V1"},
		{"my.plugin", "KVX_REATTACH_MY_PLUGIN"},
	} {
		if got := ReattachEnv(tc.in); got != tc.want {
			t.Errorf("ReattachEnv(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseReattach(t *testing.T) {
	good := Reattach{Protocol: "grpc", Version: 2, Network: "unix", Address: "/tmp/plugin1", Pid: 42}
	if got, err := ParseReattach(good.JSON()); err != nil || got != good {
		t.Errorf("ParseReattach(%s) = %+v, %v; want %+v", good.JSON(), got, err, good)
	}
	for _, tc := range []struct{ in, want string }{
		{"", "want JSON like"},
		{"{", "want JSON like"},
		{`{"protocol":"grpc","version":2,"network":"unix","address":"/tmp/p","pid":1,"extra":1}`, "unknown field"},
		{`{"protocol":"grpc","network":"unix","pid":1}`, "version, address missing"},
	} {
		if _, err := ParseReattach(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseReattach(%q) = %v, want an error saying %q", tc.in, err, tc.want)
		}
	}
	if _, err := (Reattach{Protocol: "grpc", Version: 2, Network: "pipe", Address: "x", Pid: 1}).Config(); err == nil {
		t.Error(`Config() of network "pipe" succeeded`)
	}
}
