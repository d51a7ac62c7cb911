package pluginrpc

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
)

var updateWire = flag.Bool("update", false, "rewrite testdata/wire.txt where TestWire allows it")

const wireFile = "testdata/wire.txt"

// wireHowTo is what every TestWire failure ends with.
const wireHowTo = `How to change the wire (docs/plugin-authors.md, "Changing the wire"):
  - an added field, RPC, message or enum value: add a Feature to features in
    plugins/v1/pluginrpc/contract.go whose Adds names it (or add the name to the
    Adds of the feature it belongs to), then run
    go test ./plugins/v1/pluginrpc -run TestWire -update
    and commit testdata/wire.txt with the change;
  - a removed, renumbered, retyped or renamed element, or one that moves between
    features: bump Protocol in contract.go, then run the same -update.`

// wireEntry is one element of the wire: Key names it ("kvx.v1.Batch#13",
// "kvx.v1.Worker/Forward"), Shape is what must not change, Owner the
// feature that added it or "base".
type wireEntry struct{ Owner, Key, Shape string }

// currentWire lists the elements of kvx.proto as compiled into kvxpb, each
// owned by the feature whose Adds names it, its message or its service.
func currentWire() []wireEntry {
	owner := func(names ...protoreflect.FullName) string {
		for _, f := range features {
			for _, n := range names {
				if slices.Contains(f.Adds, string(n)) {
					return string(f.Name)
				}
			}
		}
		return "base"
	}
	fd := kvxpb.File_kvx_v1_kvx_proto
	var out []wireEntry
	var message func(m protoreflect.MessageDescriptor, parents ...protoreflect.FullName)
	message = func(m protoreflect.MessageDescriptor, parents ...protoreflect.FullName) {
		names := append([]protoreflect.FullName{m.FullName()}, parents...)
		for i := 0; i < m.Fields().Len(); i++ {
			f := m.Fields().Get(i)
			typ := f.Kind().String()
			switch f.Kind() {
			case protoreflect.MessageKind, protoreflect.GroupKind:
				typ = string(f.Message().FullName())
			case protoreflect.EnumKind:
				typ = string(f.Enum().FullName())
			}
			out = append(out, wireEntry{owner(append([]protoreflect.FullName{f.FullName()}, names...)...),
				fmt.Sprintf("%s#%d", m.FullName(), f.Number()),
				fmt.Sprintf("%s %s %s", f.Name(), f.Cardinality(), typ)})
		}
		for i := 0; i < m.Messages().Len(); i++ {
			message(m.Messages().Get(i), names...)
		}
		enums(m.Enums(), &out, owner, names...)
	}
	for i := 0; i < fd.Messages().Len(); i++ {
		message(fd.Messages().Get(i))
	}
	enums(fd.Enums(), &out, owner)
	for i := 0; i < fd.Services().Len(); i++ {
		s := fd.Services().Get(i)
		for j := 0; j < s.Methods().Len(); j++ {
			m := s.Methods().Get(j)
			shape := fmt.Sprintf("%s -> %s", m.Input().FullName(), m.Output().FullName())
			if m.IsStreamingServer() {
				shape += " stream"
			}
			out = append(out, wireEntry{owner(m.FullName(), s.FullName()), fmt.Sprintf("%s/%s", s.FullName(), m.Name()), shape})
		}
	}
	return out
}

func enums(es protoreflect.EnumDescriptors, out *[]wireEntry, owner func(...protoreflect.FullName) string, parents ...protoreflect.FullName) {
	for i := 0; i < es.Len(); i++ {
		e := es.Get(i)
		for j := 0; j < e.Values().Len(); j++ {
			v := e.Values().Get(j)
			*out = append(*out, wireEntry{owner(append([]protoreflect.FullName{v.FullName(), e.FullName()}, parents...)...),
				fmt.Sprintf("%s=%d", e.FullName(), v.Number()), string(v.Name())})
		}
	}
}

// checkWire compares the recorded wire of protocol recorded with the
// current wire of protocol. It returns what is wrong and whether -update may
// record the current wire (a new protocol, or only new elements of
// features).
func checkWire(recorded int, old, cur []wireEntry, protocol int, defs []featureDef) (problems []string, updatable bool) {
	for _, f := range defs {
		for _, name := range f.Adds {
			if !wireNames[name] {
				problems = append(problems, fmt.Sprintf("feature %s names %s, which is not in kvx.proto: fix its Adds", f.Name, name))
			}
		}
	}
	if len(problems) > 0 {
		return problems, false
	}
	switch {
	case protocol == recorded+1:
		return []string{fmt.Sprintf("Protocol is %d but %s records protocol %d: run -update to record protocol %d's wire", protocol, wireFile, recorded, protocol)}, true
	case protocol != recorded:
		return []string{fmt.Sprintf("Protocol is %d but %s records protocol %d: a bump goes one at a time", protocol, wireFile, recorded)}, false
	}
	now := map[string]wireEntry{}
	for _, e := range cur {
		now[e.Key] = e
	}
	was := map[string]wireEntry{}
	updatable = true
	for _, e := range old {
		was[e.Key] = e
		n, ok := now[e.Key]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s (%s, %s) was removed: bump Protocol", e.Key, e.Shape, e.Owner))
			updatable = false
		case n.Shape != e.Shape:
			problems = append(problems, fmt.Sprintf("%s changed from %q to %q: bump Protocol", e.Key, e.Shape, n.Shape))
			updatable = false
		case n.Owner != e.Owner:
			problems = append(problems, fmt.Sprintf("%s (%s) moved from %s to %s: bump Protocol", e.Key, e.Shape, e.Owner, n.Owner))
			updatable = false
		}
	}
	for _, e := range cur {
		if _, ok := was[e.Key]; ok {
			continue
		}
		if e.Owner == "base" {
			problems = append(problems, fmt.Sprintf("%s (%s) is new and no feature claims it: add it to a Feature's Adds in contract.go (or bump Protocol)", e.Key, e.Shape))
			updatable = false
		} else {
			problems = append(problems, fmt.Sprintf("%s (%s) is new, added by feature %s: run -update to record it", e.Key, e.Shape, e.Owner))
		}
	}
	return problems, updatable
}

// wireNames are the full names a feature's Adds may use.
var wireNames = func() map[string]bool {
	names := map[string]bool{}
	fd := kvxpb.File_kvx_v1_kvx_proto
	var message func(m protoreflect.MessageDescriptor)
	message = func(m protoreflect.MessageDescriptor) {
		names[string(m.FullName())] = true
		for i := 0; i < m.Fields().Len(); i++ {
			names[string(m.Fields().Get(i).FullName())] = true
		}
		for i := 0; i < m.Messages().Len(); i++ {
			message(m.Messages().Get(i))
		}
	}
	for i := 0; i < fd.Messages().Len(); i++ {
		message(fd.Messages().Get(i))
	}
	for i := 0; i < fd.Services().Len(); i++ {
		s := fd.Services().Get(i)
		names[string(s.FullName())] = true
		for j := 0; j < s.Methods().Len(); j++ {
			names[string(s.Methods().Get(j).FullName())] = true
		}
	}
	for i := 0; i < fd.Enums().Len(); i++ {
		e := fd.Enums().Get(i)
		names[string(e.FullName())] = true
		for j := 0; j < e.Values().Len(); j++ {
			names[string(e.Values().Get(j).FullName())] = true
		}
	}
	return names
}()

func formatWire(protocol int, es []wireEntry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# The wire of kvx.proto under Protocol (plugins/v1/pluginrpc/contract.go): every field,\n")
	fmt.Fprintf(&b, "# enum value and RPC, with the feature that added it. Written by\n")
	fmt.Fprintf(&b, "#   go test ./plugins/v1/pluginrpc -run TestWire -update\n")
	fmt.Fprintf(&b, "# which TestWire allows only for a new protocol or for new elements of features.\n")
	fmt.Fprintf(&b, "protocol %d\n", protocol)
	for _, e := range es {
		fmt.Fprintf(&b, "%s\t%s\t%s\n", e.Owner, e.Key, e.Shape)
	}
	return b.String()
}

func parseWire(s string) (int, []wireEntry, error) {
	protocol := -1
	var es []wireEntry
	for i, line := range strings.Split(s, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if v, ok := strings.CutPrefix(line, "protocol "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return 0, nil, fmt.Errorf("line %d: %q", i+1, line)
			}
			protocol = n
			continue
		}
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			return 0, nil, fmt.Errorf("line %d: %q is not owner, key and shape", i+1, line)
		}
		es = append(es, wireEntry{f[0], f[1], f[2]})
	}
	if protocol < 0 {
		return 0, nil, fmt.Errorf("no protocol line")
	}
	return protocol, es, nil
}

// TestWire holds Protocol and the feature list to kvx.proto: every field,
// enum value and RPC is recorded in testdata/wire.txt with its number, type
// and the feature that added it; a change needs a feature or a protocol
// bump, and the failure says which.
func TestWire(t *testing.T) {
	cur := currentWire()
	b, err := os.ReadFile(wireFile)
	if err != nil {
		t.Fatalf("%v\n%s", err, wireHowTo)
	}
	recorded, old, err := parseWire(string(b))
	if err != nil {
		t.Fatalf("%s: %v", wireFile, err)
	}
	problems, updatable := checkWire(recorded, old, cur, Protocol, features)
	if len(problems) == 0 {
		return
	}
	if *updateWire && updatable {
		if err := os.WriteFile(wireFile, []byte(formatWire(Protocol, cur)), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("recorded %s:\n  %s", wireFile, strings.Join(problems, "\n  "))
		return
	}
	verb := "run -update"
	if !updatable {
		verb = "-update refuses until these are fixed"
	}
	t.Errorf("kvx.proto's wire differs from %s (protocol %d) (%s):\n  %s\n%s",
		wireFile, recorded, verb, strings.Join(problems, "\n  "), wireHowTo)
}

// TestCheckWire: each kind of change is caught and gets its remedy.
func TestCheckWire(t *testing.T) {
	base := []wireEntry{{"base", "kvx.v1.Batch#1", "step optional uint64"}, {"top_logprobs", "kvx.v1.Batch#13", "top_logprobs repeated int64"}}
	with := func(es ...wireEntry) []wireEntry { return append(slices.Clone(base), es...) }
	for _, tc := range []struct {
		name      string
		recorded  int
		cur       []wireEntry
		protocol  int
		want      string
		updatable bool
	}{
		{"unchanged", 3, base, 3, "", true},
		{"field of a feature added", 3, with(wireEntry{"top_logprobs", "kvx.v1.Batch#14", "x repeated int64"}), 3, "is new, added by feature top_logprobs: run -update", true},
		{"field of no feature added", 3, with(wireEntry{"base", "kvx.v1.Batch#14", "cache_salt optional string"}), 3, "no feature claims it", false},
		{"field removed", 3, base[1:], 3, "was removed: bump Protocol", false},
		{"field retyped", 3, []wireEntry{{"base", "kvx.v1.Batch#1", "step optional int64"}, base[1]}, 3, "changed from", false},
		{"feature folded into base", 3, []wireEntry{base[0], {"base", "kvx.v1.Batch#13", "top_logprobs repeated int64"}}, 3, "moved from top_logprobs to base", false},
		{"protocol bumped", 3, base[1:], 4, "run -update to record protocol 4", true},
		{"protocol jumped", 3, base, 5, "one at a time", false},
	} {
		problems, updatable := checkWire(tc.recorded, base, tc.cur, tc.protocol, features)
		got := strings.Join(problems, "; ")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) || updatable != tc.updatable {
			t.Errorf("%s: checkWire = %q, updatable %v; want %q, updatable %v", tc.name, got, updatable, tc.want, tc.updatable)
		}
	}
	bad := []featureDef{{Name: "kv_teleport", Adds: []string{"kvx.v1.Batch.teleport"}}}
	if p, _ := checkWire(3, base, base, 3, bad); len(p) != 1 || !strings.Contains(p[0], "kvx.v1.Batch.teleport, which is not in kvx.proto") {
		t.Errorf("checkWire with a feature naming a missing field = %q", p)
	}
}
