//go:build unix

package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Paths of the fake plugin (testdata/fakeplugin), built once by TestMain.
var (
	fakeManager string // kvx-fake-manager: serves a cache manager
	fakeWorker  string // kvx-fake-worker: the same binary, serves a worker
	notPlugin   string // kvx-not-a-plugin: a script that exits 3
)

func TestMain(m *testing.M) {
	if os.Getenv(signalHelperEnv) != "" {
		signalHelper() // never returns
	}
	dir, err := os.MkdirTemp("", "kvx-host-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if err := buildFakes(dir); err != nil {
			fmt.Fprintln(os.Stderr, "build fake plugin:", err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// buildFakes builds testdata/fakeplugin into dir, or copies the prebuilt
// binary named by $KVX_HOST_TEST_FAKEPLUGIN (for machines without Go).
func buildFakes(dir string) error {
	fakeManager = filepath.Join(dir, "kvx-fake-manager")
	fakeWorker = filepath.Join(dir, "kvx-fake-worker")
	notPlugin = filepath.Join(dir, "kvx-not-a-plugin")
	if prebuilt := os.Getenv("KVX_HOST_TEST_FAKEPLUGIN"); prebuilt != "" {
		b, err := os.ReadFile(prebuilt)
		if err != nil {
			return err
		}
		if err := os.WriteFile(fakeManager, b, 0o755); err != nil {
			return err
		}
	} else {
		goBin, err := exec.LookPath("go")
		if err != nil {
			return fmt.Errorf("building the fake plugin needs the go command on PATH: %v", err)
		}
		cmd := exec.Command(goBin, "build", "-o", fakeManager, "./testdata/fakeplugin")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v\n%s", cmd.Args, err, out)
		}
	}
	if err := os.Link(fakeManager, fakeWorker); err != nil {
		return err
	}
	return os.WriteFile(notPlugin, []byte("#!/bin/sh\necho not a plugin\nexit 3\n"), 0o755)
}

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHost(t *testing.T, dirs ...string) (*Host, *syncBuffer) {
	t.Helper()
	var logs syncBuffer
	h := New(hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug}), dirs)
	t.Cleanup(h.Close)
	return h, &logs
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func waitDone(t *testing.T, p *Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("plugin pid %d did not exit within 10s", p.Pid())
	}
}

func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, kvcache.ErrUnavailable) || kvcache.KindOf(err) != kvcache.KindUnavailable {
		t.Errorf("%s: error %v (kind %v), want kind %v", what, err, kvcache.KindOf(err), kvcache.KindUnavailable)
	}
}

func tracked(h *Host) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.procs)
}

// TestLaunchManagerAndClose launches a real plugin process, talks to it, and
// checks that Close leaves no process behind.
func TestLaunchManagerAndClose(t *testing.T) {
	h, logs := newHost(t)
	ctx := ctxTimeout(t)
	m, proc, err := h.LaunchManager(ctx, fakeManager)
	if err != nil {
		t.Fatalf("LaunchManager: %v", err)
	}
	st, err := m.Stats(ctx)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if st.Sequences != proc.Pid() || proc.Pid() <= 0 {
		t.Errorf("plugin reports pid %d, Process.Pid() = %d", st.Sequences, proc.Pid())
	}
	if !alive(proc.Pid()) || proc.Exited() {
		t.Fatalf("plugin pid %d not running after launch", proc.Pid())
	}
	for _, want := range []string{"plugin ready", "kind=cachemanager", "name=fake", "version=0.0.1", fmt.Sprintf("protocol=%d", pluginrpc.Protocol), featuresLog(pluginrpc.Current().Features), "prefix_reuse=true",
		"fake manager starting"} { // the last one is the plugin's own log line, forwarded
		if !strings.Contains(logs.String(), want) {
			t.Errorf("host log lacks %q:\n%s", want, logs)
		}
	}

	socketDir := h.socketDir
	if socks, _ := filepath.Glob(filepath.Join(socketDir, "plugin*")); len(socks) != 1 {
		t.Errorf("socket directory %q holds %v, want the plugin's socket", socketDir, socks)
	}
	h.Close()
	if alive(proc.Pid()) {
		t.Errorf("plugin pid %d still running after Close", proc.Pid())
	}
	if _, err := os.Stat(socketDir); !os.IsNotExist(err) {
		t.Errorf("socket directory %q remains after Close (%v)", socketDir, err)
	}
	if !proc.Exited() {
		t.Error("Process.Exited() = false after Close")
	}
	waitDone(t, proc)
	_, err = m.Stats(ctx)
	wantUnavailable(t, "Stats after Close", err)
	h.Close() // idempotent
	if _, _, err := h.LaunchManager(ctx, fakeManager); !errors.Is(err, ErrClosed) {
		t.Errorf("LaunchManager after Close: %v, want ErrClosed", err)
	}
}

func TestLaunchWorker(t *testing.T) {
	h, logs := newHost(t)
	ctx := ctxTimeout(t)
	w, proc, err := h.LaunchWorker(ctx, fakeWorker)
	if err != nil {
		t.Fatalf("LaunchWorker: %v", err)
	}
	if err := w.Health(ctx); err != nil {
		t.Errorf("Health: %v", err)
	}
	if res, err := w.Forward(ctx, worker.Batch{Step: 1}); err != nil || !res.Modelled {
		t.Errorf("Forward = %+v, %v; want a modelled result", res, err)
	}
	for _, want := range []string{"kind=worker", "name=fake-worker", "device=sim"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("host log lacks %q:\n%s", want, logs)
		}
	}
	proc.Kill()
	proc.Kill() // idempotent
	if alive(proc.Pid()) || tracked(h) != 0 {
		t.Errorf("after Kill: pid %d alive=%v, host tracks %d processes; want gone and 0", proc.Pid(), alive(proc.Pid()), tracked(h))
	}
}

// TestKilledPluginIsUnavailable: kill -9 the plugin; Done closes and the
// next call fails with KindUnavailable.
func TestKilledPluginIsUnavailable(t *testing.T) {
	h, _ := newHost(t)
	ctx := ctxTimeout(t)
	m, proc, err := h.LaunchManager(ctx, fakeManager)
	if err != nil {
		t.Fatal(err)
	}
	killHard(t, proc.Pid())
	waitDone(t, proc)
	if !proc.Exited() {
		t.Error("Process.Exited() = false after kill -9")
	}
	_, err = m.Reserve(ctx, []kvcache.ReserveItem{{Seq: 1, Tokens: 1}})
	wantUnavailable(t, "Reserve after kill -9", err)
	wantUnavailable(t, "Release after kill -9", m.Release(ctx, []kvcache.SeqID{1}))
}

// TestKilledMidCallIsUnavailable: a call in flight when the plugin dies
// returns KindUnavailable at once, without waiting for its ctx.
func TestKilledMidCallIsUnavailable(t *testing.T) {
	h, _ := newHost(t)
	ctx := ctxTimeout(t)
	for _, tc := range []struct {
		name string
		call func(ctx context.Context) (*Process, error)
	}{
		{"manager Lookup", func(ctx context.Context) (*Process, error) {
			m, proc, err := h.LaunchManager(ctx, fakeManager)
			if err != nil {
				t.Fatal(err)
			}
			go func() { time.Sleep(200 * time.Millisecond); killHard(t, proc.Pid()) }()
			_, err = m.Lookup(ctx, []kvcache.LookupItem{{Seq: 1, Prompt: []int32{1, 2}}})
			return proc, err
		}},
		{"worker Forward", func(ctx context.Context) (*Process, error) {
			w, proc, err := h.LaunchWorker(ctx, fakeWorker)
			if err != nil {
				t.Fatal(err)
			}
			go func() { time.Sleep(200 * time.Millisecond); killHard(t, proc.Pid()) }()
			_, err = w.Forward(ctx, worker.Batch{Step: 7})
			return proc, err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			proc, err := tc.call(ctx)
			wantUnavailable(t, tc.name, err)
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("call took %v after the kill, want it to fail fast", d)
			}
			waitDone(t, proc)
		})
	}
}

// TestLaunchFailuresLeaveNothing: every failed launch names the problem and
// leaves no process.
func TestLaunchFailuresLeaveNothing(t *testing.T) {
	h, _ := newHost(t)
	ctx := ctxTimeout(t)
	check := func(t *testing.T, err error, want ...string) {
		t.Helper()
		if err == nil {
			t.Fatal("launch succeeded, want an error")
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q lacks %q", err, w)
			}
		}
		if n := tracked(h); n != 0 {
			t.Errorf("host tracks %d processes after a failed launch, want 0", n)
		}
	}
	t.Run("worker as manager", func(t *testing.T) {
		_, _, err := h.LaunchManager(ctx, fakeWorker)
		check(t, err, fakeWorker, "does not serve a cache manager")
		if kvcache.KindOf(err) != kvcache.KindUnsupported {
			t.Errorf("kind %v, want %v", kvcache.KindOf(err), kvcache.KindUnsupported)
		}
	})
	t.Run("manager as worker", func(t *testing.T) {
		_, _, err := h.LaunchWorker(ctx, fakeManager)
		check(t, err, "does not serve a worker")
	})
	t.Run("protocol mismatch", func(t *testing.T) {
		t.Setenv("FAKEPLUGIN_PROTOCOLS", "2,3")
		_, _, err := h.LaunchManager(ctx, fakeManager)
		check(t, err, "[2 3]", "does not include 1")
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("errors.Is(%v, ErrProtocol) = false", err)
		}
	})
	t.Run("not a plugin", func(t *testing.T) {
		_, _, err := h.LaunchManager(ctx, notPlugin)
		check(t, err, notPlugin, "start")
	})
	t.Run("missing", func(t *testing.T) {
		_, _, err := h.LaunchManager(ctx, filepath.Join(t.TempDir(), "kvx-nope"))
		check(t, err, "kvx-nope", "no such file")
	})
	t.Run("cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, _, err := h.LaunchManager(cctx, fakeManager)
		check(t, err, "context canceled")
	})
}

// TestChannelIsTLS: by default a plugin's gRPC channel is mutual TLS
// (AutoMTLS): a plain-text client at the plugin's own address is refused,
// while the host's calls work. With AutoMTLS off the same plain-text client
// is answered, so the refusal is the TLS, not the probe.
func TestChannelIsTLS(t *testing.T) {
	for _, mtls := range []bool{true, false} {
		h, _ := newHost(t)
		if !h.AutoMTLS {
			t.Fatal("New left AutoMTLS off")
		}
		h.AutoMTLS = mtls
		ctx := ctxTimeout(t)
		m, proc, err := h.LaunchManager(ctx, fakeManager)
		if err != nil {
			t.Fatalf("LaunchManager (AutoMTLS %v): %v", mtls, err)
		}
		if _, err := m.Reserve(ctx, []kvcache.ReserveItem{{Seq: 1, Tokens: 1}}); err != nil {
			t.Errorf("Reserve (AutoMTLS %v): %v", mtls, err)
		}
		addr := proc.client.ReattachConfig().Addr
		// The plugin's socket lies in go-plugin's directory inside the
		// host's: both mode 0700 (the data plane's lies there too).
		for _, d := range []string{filepath.Dir(addr.String()), h.socketDir} {
			fi, err := os.Stat(d)
			if err != nil {
				t.Fatal(err)
			}
			if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
				t.Errorf("socket directory %s: mode %v, want a directory of mode 0700", d, fi.Mode())
			}
		}
		if filepath.Dir(filepath.Dir(addr.String())) != h.socketDir {
			t.Errorf("plugin socket %s is not inside the host's socket directory %s", addr, h.socketDir)
		}
		cc, err := grpc.NewClient("unix://"+addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{Service: "plugin"})
		cancel()
		_ = cc.Close()
		switch {
		case mtls && err == nil:
			t.Errorf("a plain-text gRPC client at %s was answered: the channel is not TLS", addr)
		case !mtls && err != nil:
			t.Errorf("AutoMTLS off: plain-text health check at %s: %v, want an answer (the probe works)", addr, err)
		}
	}
}

func TestFind(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	write := func(path string, mode os.FileMode) {
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dirA, "kvx-noexec"), 0o644)
	write(filepath.Join(dirB, "kvx-noexec"), 0o755)
	write(filepath.Join(dirA, "kvx-both"), 0o755)
	write(filepath.Join(dirB, "kvx-both"), 0o755)
	if err := os.Mkdir(filepath.Join(dirA, "kvx-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := New(nil, []string{dirA, dirB})
	for _, tc := range []struct {
		name, want string
	}{
		{"kvx-both", filepath.Join(dirA, "kvx-both")},     // first directory wins
		{"kvx-noexec", filepath.Join(dirB, "kvx-noexec")}, // non-executables are skipped
		{filepath.Join(dirB, "kvx-both"), filepath.Join(dirB, "kvx-both")},
	} {
		if got, err := h.Find(tc.name); err != nil || got != tc.want {
			t.Errorf("Find(%q) = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	for _, name := range []string{"kvx-missing", "kvx-dir", filepath.Join(dirA, "kvx-noexec"), ""} {
		_, err := h.Find(name)
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("Find(%q) error = %v, want ErrNotFound", name, err)
		}
	}
	_, err := h.Find("kvx-missing")
	for _, dir := range h.SearchPath() {
		if !strings.Contains(err.Error(), dir) {
			t.Errorf("Find error %q does not list searched directory %s", err, dir)
		}
	}
	exe, _ := os.Executable()
	exe, _ = filepath.EvalSymlinks(exe)
	bin, _ := filepath.Abs("bin")
	if sp := h.SearchPath(); len(sp) != 4 || sp[0] != filepath.Dir(exe) || sp[1] != bin || sp[2] != dirA || sp[3] != dirB {
		t.Errorf("SearchPath() = %v, want [%s %s %s %s]", sp, filepath.Dir(exe), bin, dirA, dirB)
	}
}

func TestPlugins(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	link := func(src, dst string) {
		if err := os.Link(src, dst); err != nil {
			t.Fatal(err)
		}
	}
	link(fakeManager, filepath.Join(dirA, "kvx-fake-manager"))
	link(fakeWorker, filepath.Join(dirA, "kvx-fake-worker"))
	link(notPlugin, filepath.Join(dirA, "kvx-not-a-plugin"))
	link(fakeManager, filepath.Join(dirB, "kvx-fake-manager")) // shadowed by dirA's
	if err := os.WriteFile(filepath.Join(dirA, "kvx-readme.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirA, "other-tool"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	h, _ := newHost(t, dirA, dirB)
	found := h.Plugins()
	type row struct {
		Name, Dir, Kind, Info string
		Shadowed, Err         bool
	}
	var got []row
	for _, f := range found {
		r := row{Name: f.Name, Dir: filepath.Dir(f.Path), Kind: f.Kind, Shadowed: f.Shadowed, Err: f.Err != nil}
		switch {
		case f.Manager != nil:
			r.Info = f.Manager.Name + " " + f.Manager.Version
		case f.Worker != nil:
			r.Info = f.Worker.Name + " " + f.Worker.Device
		}
		got = append(got, r)
	}
	want := []row{
		{"kvx-fake-manager", dirA, pluginrpc.ManagerPluginName, "fake 0.0.1", false, false},
		{"kvx-fake-worker", dirA, pluginrpc.WorkerPluginName, "fake-worker sim", false, false},
		{"kvx-not-a-plugin", dirA, "", "", false, true},
		{"kvx-fake-manager", dirB, pluginrpc.ManagerPluginName, "fake 0.0.1", true, false},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Plugins() =\n%v\nwant\n%v", got, want)
	}
	if n := tracked(h); n != 0 {
		t.Errorf("host tracks %d processes after Plugins, want 0", n)
	}
}

// TestPluginThreads: ManagerThreads reaches the plugin's GOMAXPROCS (the
// host starts plugins with an environment of its own, so nothing else
// would), and 0 leaves the plugin's own choice (the SDK's: one thread).
func TestPluginThreads(t *testing.T) {
	for _, n := range []int{0, 1, 3} {
		h, _ := newHost(t)
		h.ManagerThreads = n
		ctx := ctxTimeout(t)
		m, _, err := h.LaunchManager(ctx, fakeManager)
		if err != nil {
			t.Fatal(err)
		}
		st, err := m.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := n
		if n == 0 {
			want = 1
		}
		if st.SuspendedSeqs != want {
			t.Errorf("ManagerThreads %d: plugin GOMAXPROCS %d, want %d", n, st.SuspendedSeqs, want)
		}
	}
}

// TestInstancesShareAProcess: one plugin process serves several managers,
// each made by the plugin's factory; their calls, concurrent or not, reach
// their own instance, and all of them go when the process does.
func TestInstancesShareAProcess(t *testing.T) {
	h, _ := newHost(t)
	t.Cleanup(h.Close)
	ctx := ctxTimeout(t)
	first, proc, err := h.LaunchManager(ctx, fakeManager)
	if err != nil {
		t.Fatal(err)
	}
	ms := []kvcache.Manager{first}
	for range 2 {
		m, err := h.ManagerInstance(ctx, first, proc)
		if err != nil {
			t.Fatalf("ManagerInstance: %v", err)
		}
		ms = append(ms, m)
	}
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			for range 50 {
				g, err := m.Reserve(ctx, []kvcache.ReserveItem{{Seq: kvcache.SeqID(i), New: true, Tokens: 1}})
				if err != nil || len(g) != 1 || g[0].Seq != kvcache.SeqID(i) || !g[0].OK {
					t.Errorf("instance %d: Reserve = %+v, %v", i, g, err)
					return
				}
				st, err := m.Stats(ctx)
				if err != nil || st.Evictions != int64(i) || st.Sequences != proc.Pid() {
					t.Errorf("instance %d: Stats = instance %d of pid %d (%v), want instance %d of pid %d", i, st.Evictions, st.Sequences, err, i, proc.Pid())
					return
				}
			}
		})
	}
	wg.Wait()
	if n := tracked(h); n != 1 {
		t.Errorf("%d processes tracked, want 1", n)
	}
	proc.Kill()
	for i, m := range ms {
		_, err := m.Stats(ctx)
		wantUnavailable(t, fmt.Sprintf("instance %d after the process was killed", i), err)
	}
}

// featuresLog is how the host's "plugin ready" line spells a feature list:
// features=["a", "b"].
func featuresLog(fs []pluginrpc.Feature) string {
	q := make([]string, len(fs))
	for i, f := range fs {
		q[i] = fmt.Sprintf("%q", f)
	}
	return "features=[" + strings.Join(q, ", ") + "]"
}
