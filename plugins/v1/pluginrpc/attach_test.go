//go:build unix

package pluginrpc

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/protobuf/proto"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/internal/plane"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// The data plane against a second local process: the test binary runs as
// a real plugin process (roleEnv=plugin) launched by go-plugin as kvx
// launches one (AutoMTLS, a private socket directory), the test opens data
// planes on it, and the test binary runs again as an intruder
// (roleEnv=intruder) that tries to attach to them.

const roleEnv = "KVX_PLUGINRPC_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "plugin":
		plugin.Serve(&plugin.ServeConfig{
			HandshakeConfig:  Handshake,
			VersionedPlugins: ServedPlugins(func() kvcache.Manager { return fullFake() }, nil),
			GRPCServer:       NewGRPCServer,
			Logger:           hclog.New(&hclog.LoggerOptions{Output: os.Stderr, JSONFormat: true, Level: hclog.Warn}),
		})
		os.Exit(0)
	case "intruder":
		fmt.Println(intrude(os.Getenv("KVX_INTRUDER_MODE"), os.Getenv("KVX_INTRUDER_ADDR"), os.Getenv("KVX_INTRUDER_TOKEN")))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// intrude tries to attach to the data plane at addr and to have a Release
// answered: with no token at all (a request frame straight away), or
// presenting token (hex) as the host would. It says "answered" or why not.
func intrude(mode, addr, token string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if mode == "none" {
		c, err := net.DialTimeout("unix", addr, time.Second)
		if err != nil {
			return "refused: dial: " + err.Error()
		}
		defer c.Close()
		msg, _ := proto.Marshal(&kvxpb.Seqs{Seqs: []uint64{1}})
		frame := make([]byte, 16, 16+len(msg))
		binary.LittleEndian.PutUint32(frame, uint32(len(msg)))
		frame[4] = byte(plane.Release)
		frame = append(frame, msg...)
		if _, err := c.Write(frame); err != nil {
			return "refused: write: " + err.Error()
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := io.ReadFull(c, make([]byte, 16))
		if err != nil {
			return fmt.Sprintf("refused: read %d bytes: %v", n, err)
		}
		return "answered"
	}
	tok, err := hex.DecodeString(token)
	if err != nil {
		return "bad token: " + err.Error()
	}
	dp, err := plane.Dial(ctx, &kvxpb.DataPlane{Network: "unix", Address: addr, Token: tok, Version: plane.Version})
	if err != nil {
		return "refused: dial: " + err.Error()
	}
	defer dp.Shut(errors.New("intruder done"))
	if err := dp.Call(ctx, 0, plane.Release, &kvxpb.Seqs{Seqs: []uint64{1}}, new(kvxpb.Empty)); err != nil {
		return "refused: call: " + err.Error()
	}
	return "answered"
}

// runIntruder runs the intruder as a process of its own.
func runIntruder(t *testing.T, mode, addr string, token []byte) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"=intruder", "KVX_INTRUDER_MODE="+mode,
		"KVX_INTRUDER_ADDR="+addr, "KVX_INTRUDER_TOKEN="+hex.EncodeToString(token))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("intruder %s: %v", mode, err)
	}
	last := ""
	for sc := bufio.NewScanner(strings.NewReader(string(out))); sc.Scan(); {
		last = sc.Text()
	}
	return last
}

// TestDataPlaneRefusesASecondProcess: another local process cannot attach
// to a plugin's data plane without its one-time token: not with no token,
// not with a wrong one, not by replaying the token the host used (on that
// plane, whose socket is gone once the host attached, or on a fresh one);
// with the fresh plane's own token the same intruder is answered, so the
// refusals are the token's. The plane's directory is the plugin's alone
// (mode 0700, in the host's 0700 socket directory).
func TestDataPlaneRefusesASecondProcess(t *testing.T) {
	sockDir, err := os.MkdirTemp("", "kvx-attach-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// The directory core/host gives go-plugin for the plugin's sockets (with
	// a RunnerFunc, go-plugin names it to the plugin in this variable).
	cmd.Env = append(os.Environ(), roleEnv+"=plugin", plugin.EnvUnixSocketDir+"="+sockDir)
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: HostPlugins(),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: sockDir},
		Logger:           hclog.NewNullLogger(),
	})
	t.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("start the plugin: %v", err)
	}
	cm := kvxpb.NewCacheManagerClient(rpc.(*plugin.GRPCClient).Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func() *kvxpb.DataPlane {
		t.Helper()
		stream, err := cm.OpenDataPlane(ctx, &kvxpb.DataPlaneRequest{Version: plane.Version})
		if err != nil {
			t.Fatalf("OpenDataPlane: %v", err)
		}
		dp, err := stream.Recv()
		if err != nil {
			t.Fatalf("OpenDataPlane: %v", err)
		}
		checkPrivate(t, dp.GetAddress(), sockDir)
		return dp
	}
	refused := func(what, got string) {
		t.Helper()
		if !strings.HasPrefix(got, "refused") {
			t.Errorf("intruder %s: %s, want refused", what, got)
		} else {
			t.Logf("intruder %s: %s", what, got)
		}
	}

	refused("with no token", runIntruder(t, "none", open().GetAddress(), nil))
	wrong := make([]byte, len(open().GetToken()))
	_, _ = rand.Read(wrong)
	refused("with a wrong token", runIntruder(t, "token", open().GetAddress(), wrong))

	// The host attaches with the token, then the intruder replays it.
	used := open()
	host, err := plane.Dial(ctx, used)
	if err != nil {
		t.Fatalf("the host's Dial: %v", err)
	}
	defer host.Shut(errors.New("test done"))
	if err := host.Call(ctx, 0, plane.Release, &kvxpb.Seqs{Seqs: []uint64{7}}, new(kvxpb.Empty)); err != nil {
		t.Fatalf("the host's Release on its plane: %v", err)
	}
	if _, err := os.Stat(used.GetAddress()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the host attached, its plane's socket %s: stat error %v, want it gone", used.GetAddress(), err)
	}
	refused("replaying the host's token on its plane", runIntruder(t, "token", used.GetAddress(), used.GetToken()))
	fresh := open()
	refused("replaying the host's token on a fresh plane", runIntruder(t, "token", fresh.GetAddress(), used.GetToken()))

	if got := runIntruder(t, "token", open().GetAddress(), open().GetToken()); !strings.HasPrefix(got, "refused") {
		t.Errorf("intruder with another plane's token: %s, want refused", got)
	}
	ok := open()
	if got := runIntruder(t, "token", ok.GetAddress(), ok.GetToken()); got != "answered" {
		t.Errorf("intruder with the plane's own token: %s, want answered (the probe itself must work)", got)
	}
	if err := host.Call(ctx, 0, plane.Release, &kvxpb.Seqs{Seqs: []uint64{8}}, new(kvxpb.Empty)); err != nil {
		t.Errorf("the host's plane after the intruders: %v", err)
	}
}

// checkPrivate checks that the plane's socket sits in a directory of its
// own, mode 0700 and ours, inside dir.
func checkPrivate(t *testing.T, addr, dir string) {
	t.Helper()
	d := filepath.Dir(addr)
	if filepath.Dir(d) != dir {
		t.Errorf("data plane socket %s is not in a directory of its own inside the host's %s", addr, dir)
	}
	for _, p := range []string{d, dir} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || fi.Mode().Perm() != 0o700 || int(st.Uid) != os.Getuid() {
			t.Errorf("%s: mode %v, owner %d; want a directory of mode 0700 owned by %d", p, fi.Mode(), st.Uid, os.Getuid())
		}
	}
	fi, err := os.Stat(addr)
	if err != nil {
		t.Fatalf("data plane socket: %v", err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		t.Errorf("%s: mode %v, want a socket", addr, fi.Mode())
	}
}
