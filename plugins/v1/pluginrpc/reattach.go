package pluginrpc

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-plugin"
)

// The reattach variable is what both sides of the SDK's debug mode share: a
// plugin started by hand (plugins/sdk.DebugEnv) prints it, and the host
// (core/host) reads it and attaches to that process instead of starting one.

// ReattachEnvPrefix starts the name of every reattach variable (ReattachEnv).
// kvx's config loader leaves these variables alone: they are not config keys.
const ReattachEnvPrefix = "KVX_REATTACH_"

// ReattachEnv returns the name of the variable through which kvx attaches to
// a running plugin binary (a path or a file name): ReattachEnvPrefix and the
// file name without "kvx-", upper-cased, with every character other than a
// letter or a digit replaced by '_'. kvx-fifo and ./bin/kvx-fifo give
// KVX_REATTACH_FIFO; kvx-cachemgr-v1 gives KVX_REATTACH_CACHEMGR_V1.
func ReattachEnv(binary string) string {
	name := strings.TrimPrefix(filepath.Base(binary), "kvx-")
	return ReattachEnvPrefix + strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name)
}

// Reattach says where a running plugin listens: the value of its reattach
// variable, as JSON. It is go-plugin's ReattachConfig in a form that
// survives a shell.
type Reattach struct {
	Protocol string `json:"protocol"` // "grpc"
	Version  int    `json:"version"`  // the transport protocol version it serves (go-plugin's negotiated version)
	Network  string `json:"network"`  // "unix" or "tcp"
	Address  string `json:"address"`  // socket path or host:port
	Pid      int    `json:"pid"`
}

// ParseReattach reads the value of a reattach variable. Every field must be
// set; the error names what is missing.
func ParseReattach(s string) (Reattach, error) {
	var r Reattach
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Reattach{}, fmt.Errorf("reattach config %q: %v; want JSON like %s", s, err, Reattach{"grpc", 2, "unix", "/tmp/plugin123", 4242}.JSON())
	}
	var missing []string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"protocol", r.Protocol != ""}, {"version", r.Version > 0}, {"network", r.Network != ""},
		{"address", r.Address != ""}, {"pid", r.Pid > 0},
	} {
		if !f.ok {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return Reattach{}, fmt.Errorf("reattach config %q: %s missing", s, strings.Join(missing, ", "))
	}
	return r, nil
}

// JSON is r as the value of a reattach variable.
func (r Reattach) JSON() string {
	b, _ := json.Marshal(r) // a struct of strings and ints cannot fail
	return string(b)
}

// Config returns the go-plugin reattach config of r, for
// plugin.ClientConfig.Reattach. It is in go-plugin's test mode: the client
// never kills the process, which belongs to whoever started it.
func (r Reattach) Config() (*plugin.ReattachConfig, error) {
	var addr net.Addr
	var err error
	switch r.Network {
	case "unix":
		addr, err = net.ResolveUnixAddr("unix", r.Address)
	case "tcp":
		addr, err = net.ResolveTCPAddr("tcp", r.Address)
	default:
		err = fmt.Errorf("network %q; want unix or tcp", r.Network)
	}
	if err != nil {
		return nil, fmt.Errorf("reattach config: %w", err)
	}
	return &plugin.ReattachConfig{Protocol: plugin.Protocol(r.Protocol), ProtocolVersion: r.Version,
		Addr: addr, Pid: r.Pid, Test: true}, nil
}
