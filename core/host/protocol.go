package host

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/go-plugin"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// handshakeVersion finds the transport protocol version a plugin offered in
// go-plugin's handshake error, which carries it only in its text
// ("incompatible API version with plugin. Plugin version: 9, Client
// versions: [1 2]"). TestUnknownTransportProtocol pins the text against
// the go-plugin in go.mod.
var handshakeVersion = regexp.MustCompile(`Plugin version: (\d+), Client versions`)

// startError explains a failed start. A plugin built for a transport
// protocol this kvx does not speak gets an error that names both versions
// and wraps ErrProtocol; any other failure is returned as is.
func startError(err error, versions map[int]plugin.PluginSet) error {
	if m := handshakeVersion.FindStringSubmatch(err.Error()); m != nil {
		if theirs, convErr := strconv.Atoi(m[1]); convErr == nil {
			return protocolMismatch(theirs, versions)
		}
	}
	return fmt.Errorf("start: %w", err)
}

// protocolMismatch is the error of a plugin that speaks transport protocol
// theirs, which is not among the versions this kvx speaks.
func protocolMismatch(theirs int, versions map[int]plugin.PluginSet) error {
	ours := slices.Sorted(maps.Keys(versions))
	return fmt.Errorf("the plugin speaks protocol %d, kvx speaks %s (carrying contract v%d); rebuild the plugin against this kvx's plugins/sdk: %w",
		theirs, speaks(ours), kvcache.ProtocolVersion, ErrProtocol)
}

// speaks names versions for a message: "protocol 2", "protocols 1 and 2",
// "protocols 1, 2 and 3".
func speaks(versions []int) string {
	s := make([]string, len(versions))
	for i, v := range versions {
		s[i] = strconv.Itoa(v)
	}
	if len(s) == 1 {
		return "protocol " + s[0]
	}
	return "protocols " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
