package pluginrpc

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestNegotiate(t *testing.T) {
	c := func(p int, fs, req []Feature) Contract { return Contract{Protocol: p, Features: fs, Required: req} }
	tl, kt := FeatureTopLogprobs, Feature("kv_teleport")
	for _, tc := range []struct {
		name         string
		host, plugin Contract
		want         []Feature
		err          string
	}{
		{"same", c(3, []Feature{tl}, nil), c(3, []Feature{tl}, nil), []Feature{tl}, ""},
		{"unknown feature ignored", c(3, []Feature{tl}, nil), c(3, []Feature{kt, tl}, nil), []Feature{tl}, ""},
		{"optional feature missing", c(3, []Feature{tl}, nil), c(3, nil, nil), nil, ""},
		{"older plugin", c(3, nil, nil), c(2, nil, nil), nil, "the plugin is older than this kvx"},
		{"newer plugin", c(3, nil, nil), c(4, nil, nil), nil, "use a kvx that speaks protocol 4"},
		{"host requires", c(3, []Feature{kt}, []Feature{kt}), c(3, []Feature{tl}, nil), nil, "this kvx requires feature kv_teleport, which the plugin lacks"},
		{"plugin requires", c(3, []Feature{tl}, nil), c(3, []Feature{tl, kt}, []Feature{kt}), nil, "the plugin requires feature kv_teleport, which this kvx lacks"},
	} {
		got, err := Negotiate(tc.host, tc.plugin)
		if tc.err == "" {
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("%s: Negotiate = %v, %v; want %v", tc.name, got, err, tc.want)
			}
			continue
		}
		var me *MismatchError
		if !errors.As(err, &me) || !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: Negotiate error = %v, want a *MismatchError containing %q", tc.name, err, tc.err)
		}
	}
}

// TestCurrent: this build says Protocol and every feature, and Hello
// carries it across unchanged.
func TestCurrent(t *testing.T) {
	c := Current()
	if c.Protocol != Protocol || len(c.Features) != len(features) || Handshake.ProtocolVersion != uint(Protocol) {
		t.Errorf("Current() = %+v, Handshake %d; want protocol %d and %d features", c, Handshake.ProtocolVersion, Protocol, len(features))
	}
	c.Required = []Feature{"x"}
	if got := fromSide(toSide(c)); !slices.Equal(got.Features, c.Features) || !slices.Equal(got.Required, c.Required) || got.Protocol != c.Protocol || got.Build != c.Build {
		t.Errorf("fromSide(toSide(%+v)) = %+v", c, got)
	}
}
