package host

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// handshakeVersion finds the transport protocol version a plugin offered in
// go-plugin's handshake error, which carries it only in its text
// ("incompatible API version with plugin. Plugin version: 9, Client
// versions: [1 2]"). TestUnknownTransportProtocol pins the text against
// the go-plugin in go.mod.
var handshakeVersion = regexp.MustCompile(`Plugin version: (\d+), Client versions`)

// startError explains a failed start. A plugin built for a wire protocol
// this kvx does not speak (refused by go-plugin's handshake, before any
// Hello) gets a *pluginrpc.MismatchError that names both sides and what to
// rebuild, wrapped with ErrProtocol; any other failure is returned as is.
func startError(err error, ours pluginrpc.Contract) error {
	if m := handshakeVersion.FindStringSubmatch(err.Error()); m != nil {
		if theirs, convErr := strconv.Atoi(m[1]); convErr == nil {
			return protocolMismatch(theirs, ours)
		}
	}
	return fmt.Errorf("start: %w", err)
}

// protocolMismatch is the error of a plugin that speaks wire protocol
// theirs, known from its handshake alone.
func protocolMismatch(theirs int, ours pluginrpc.Contract) error {
	me := &pluginrpc.MismatchError{Host: ours, Plugin: pluginrpc.Contract{Protocol: theirs}}
	return fmt.Errorf("%w: %w", me, ErrProtocol)
}
