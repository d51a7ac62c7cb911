// Package host finds, launches and supervises kvx plugin processes (cache
// managers and workers) and hands the core plain kvcache.Manager and
// worker.Worker values: the core never sees the transport.
//
// Life cycle: New, then LaunchManager / LaunchWorker; each launch starts
// the binary with go-plugin (gRPC only, AutoMTLS), whose handshake refuses
// a plugin of another wire protocol (pluginrpc.Protocol), then says Hello
// (pluginrpc.Negotiate: the features both offer, a required one missing is
// refused), asks Info, checks that the plugin speaks contract v1 and logs
// what was negotiated. Every refusal names both sides and what to rebuild
// and wraps ErrProtocol. A process serves
// instances (pluginrpc.InstancesProtocol): it gives the further pipeline
// stages theirs through ManagerInstance / WorkerInstance, so one process
// per plugin binary serves every stage. Close
// kills every child. A plugin that dies is reported by its Process (Done,
// Exited) and by its clients, whose calls then fail with
// kvcache.KindUnavailable; restarting it is the caller's policy.
//
// Process groups and hung plugins: every plugin runs in a process group of
// its own, and a kill takes the whole group, so what a wrapper script
// started goes with it. A plugin that stops answering (kill -STOP, a
// deadlock) is the caller's to detect; Process.Abort kills it at once. A
// start is bounded by the launch ctx and StartTimeout, and a plugin that
// never completes its handshake (a wrapper that sleeps instead of exec'ing
// the plugin) is killed, group and all, at that bound: the launch never
// waits on the pipes an orphan could hold.
//
// Children and signals: plugins ignore SIGINT, and run in process groups of
// their own (a terminal's Ctrl-C reaches kvx alone; the host decides), so
// the host must kill them.
// Either call HandleSignals once at startup (SIGINT/SIGTERM kill the children,
// then end the process as the signal would have), or, when the program
// handles those signals itself, call Close from its handler before exiting.
// Launches are not Managed: go-plugin keeps every Managed client in a
// package-level list for plugin.CleanupClients and never drops one, so each
// plugin restart of a long-running kvx serve kept the dead client (its
// logger, process, TLS certificates) for good; CleanupClients does not know
// these children.
// On Linux a child also gets SIGKILL when the host dies without running any
// of that (kill -9), through the parent-death signal.
package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// ErrNotFound is returned (wrapped) by Find when no plugin binary matches.
var ErrNotFound = errors.New("plugin not found")

// ErrClosed is returned by launches after Close.
var ErrClosed = errors.New("plugin host closed")

// ErrProtocol is returned (wrapped) by launches when the plugin speaks
// another wire protocol (its handshake), lacks a feature this kvx requires
// or requires one this kvx lacks (Hello), or does not speak contract v1
// (Info); pluginrpc.ErrMismatch is wrapped too, except for the last.
var ErrProtocol = errors.New("plugin protocol mismatch")

// NamePrefix starts the file name of every plugin binary Plugins lists.
const NamePrefix = "kvx-"

// DefaultStartTimeout bounds a plugin's start (process up and handshake
// written) when the launch ctx has no earlier deadline and
// Host.StartTimeout is 0.
const DefaultStartTimeout = time.Minute

// ErrStartTimeout is returned (wrapped) by launches when the plugin did not
// complete go-plugin's handshake within the start timeout.
var ErrStartTimeout = errors.New("plugin start timed out")

// killWait bounds how long Kill waits for go-plugin to stop a process
// (its own graceful wait is 2 s) before it kills the process group, and
// abandonWait how long it then waits for go-plugin's goroutines before it
// gives up on them: nothing blocks on a plugin forever.
const (
	killWait    = 4 * time.Second
	abandonWait = 2 * time.Second
)

// Host launches and tracks plugin processes. Its methods are safe for
// concurrent use.
type Host struct {
	logger     hclog.Logger
	searchDirs []string

	// AutoMTLS makes go-plugin secure each plugin's gRPC connection with
	// mutual TLS on throw-away certificates (New turns it on): another
	// local process that reaches the socket can neither talk to the plugin
	// nor pose as it. The per-step calls travel on the data plane, which
	// has its own one-time token; TLS added about 5-20% to a 256-item
	// Reserve+Commit round trip over gRPC (BenchmarkReserveCommitProcess).
	// Set it before launching.
	AutoMTLS bool
	// GRPCOnly keeps every plugin call on gRPC (config plugin_transport:
	// grpc). By default the per-step calls use the data plane a plugin
	// offers (pluginrpc: one framed write and read per call instead of an
	// HTTP/2 exchange). Set it before launching.
	GRPCOnly bool
	// ManagerThreads and WorkerThreads, when positive, are the GOMAXPROCS
	// of the cache manager and worker plugins; 0 leaves the plugin's own
	// choice (a plugin built on the SDK runs on one thread: it answers one
	// call at a time). A worker whose device computes (cpu) wants every
	// core for its kernels. Set them before launching.
	ManagerThreads, WorkerThreads int
	// StartTimeout, when positive, bounds each plugin's start (process up
	// and handshake written) instead of DefaultStartTimeout; the launch
	// ctx's deadline still wins when earlier. Set it before launching.
	StartTimeout time.Duration

	// contract is what this host says in Hello, when not
	// pluginrpc.Current() (tests that play an older kvx).
	contract *pluginrpc.Contract

	mu        sync.Mutex
	procs     map[*Process]struct{}
	closed    bool
	sigStop   chan struct{}
	socketDir string // private directory for the plugins' unix sockets
}

// New returns a host that logs to logger (hclog.NewNullLogger() when nil)
// and looks for plugins in the directory of the running executable, then
// ./bin, then each of searchDirs.
func New(logger hclog.Logger, searchDirs []string) *Host {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Host{logger: logger, searchDirs: slices.Clone(searchDirs), procs: map[*Process]struct{}{}, AutoMTLS: true}
}

func (h *Host) threads(kind string) int {
	if kind == pluginrpc.ManagerPluginName {
		return h.ManagerThreads
	}
	return h.WorkerThreads
}

func (h *Host) clientOptions() []pluginrpc.ClientOption {
	if h.GRPCOnly {
		return []pluginrpc.ClientOption{pluginrpc.GRPCOnly()}
	}
	return nil
}

// SearchPath returns the directories Find and Plugins look in, in order:
// the running executable's directory, ./bin (absolute), then the search
// directories given to New. Duplicates are dropped.
func (h *Host) SearchPath() []string {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		if exe, err := filepath.EvalSymlinks(exe); err == nil {
			dirs = append(dirs, filepath.Dir(exe))
		}
	}
	if bin, err := filepath.Abs("bin"); err == nil {
		dirs = append(dirs, bin)
	}
	dirs = append(dirs, h.searchDirs...)
	seen := map[string]bool{}
	out := dirs[:0]
	for _, d := range dirs {
		if !seen[filepath.Clean(d)] {
			seen[filepath.Clean(d)] = true
			out = append(out, d)
		}
	}
	return out
}

// Find returns the path of the plugin binary name (such as
// "kvx-cachemgr-v1"), searching SearchPath in order. A name containing a
// path separator is a path and is only checked. The error wraps ErrNotFound
// and lists every place it looked.
func (h *Host) Find(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("find plugin: empty name: %w", ErrNotFound)
	}
	if strings.ContainsRune(name, os.PathSeparator) || strings.ContainsRune(name, '/') {
		if err := executable(name); err != nil {
			return "", fmt.Errorf("plugin %s: %v: %w", name, err, ErrNotFound)
		}
		return name, nil
	}
	var looked []string
	for _, dir := range h.SearchPath() {
		p := filepath.Join(dir, name)
		if executable(p) == nil {
			return p, nil
		}
		looked = append(looked, dir)
	}
	return "", fmt.Errorf("plugin %q is not in any of %d directories searched (%s): %w",
		name, len(looked), strings.Join(looked, ", "), ErrNotFound)
}

// executable reports why path is not an executable regular file, or nil.
func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (mode %v)", fi.Mode())
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("not executable (mode %v)", fi.Mode().Perm())
	}
	return nil
}

// Process is one running plugin binary. Its methods are safe for concurrent
// use.
type Process struct {
	host   *Host
	path   string
	client *plugin.Client
	rpc    plugin.ClientProtocol
	pid    int
	done   <-chan struct{}
	// contract is what the plugin said in Hello; agreed the features both
	// offer.
	contract pluginrpc.Contract
	agreed   []pluginrpc.Feature

	mu     sync.Mutex
	runner *groupRunner // nil for a plugin attached to (reattach.go): never killed
}

// Contract returns what the plugin said in Hello: its wire protocol and
// features.
func (p *Process) Contract() pluginrpc.Contract { return p.contract }

// Features returns the features both this kvx and the plugin offer.
func (p *Process) Features() []pluginrpc.Feature { return slices.Clone(p.agreed) }

// Path returns the binary the process runs.
func (p *Process) Path() string { return p.path }

// Pid returns the process id.
func (p *Process) Pid() int { return p.pid }

// Done is closed once the process has exited, for any reason.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return p.client.Exited()
	}
}

// Kill ends the process and waits until it is gone: it asks the plugin to
// stop, and after two seconds kills its process group. Calls in flight fail
// with KindUnavailable. Kill is idempotent.
func (p *Process) Kill() { p.stop(false) }

// Abort kills the process group at once, without asking the plugin: for a
// plugin that stopped answering, or that never completed its handshake.
// Calls in flight fail with KindUnavailable. Like Kill it waits until the
// process is gone, but never longer than a few seconds. Abort is
// idempotent, and may follow or overlap Kill.
func (p *Process) Abort() { p.stop(true) }

// killedFromOutside reports whether the process this host started ended by
// a signal it did not send (groupRunner.killedFromOutside), and how.
func (p *Process) killedFromOutside() (string, bool) {
	p.mu.Lock()
	r := p.runner
	p.mu.Unlock()
	if r == nil {
		return "", false
	}
	return r.killedFromOutside(startReapWait)
}

func (p *Process) stop(now bool) {
	if now {
		p.killGroup()
	}
	done := make(chan struct{})
	go func() {
		p.client.Kill()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(killWait):
		p.killGroup()
		select {
		case <-done:
		case <-time.After(abandonWait):
			p.host.logger.Warn("plugin process group killed, but go-plugin still waits on it; giving up waiting",
				"path", p.path, "pid", p.pid)
		}
	}
	p.killGroup() // whatever the plugin started and left behind
	p.host.forget(p)
}

// killGroup sends SIGKILL to the process group of a plugin this host
// started; it leaves a plugin attached to alone.
func (p *Process) killGroup() {
	p.mu.Lock()
	r := p.runner
	p.mu.Unlock()
	if r != nil {
		_ = r.Kill(context.Background())
	}
}

func (h *Host) forget(p *Process) {
	h.mu.Lock()
	delete(h.procs, p)
	h.mu.Unlock()
}

// LaunchManager starts the cache-manager plugin at path, checks its Info and
// returns a client for it. The client's calls are tied to the process: once
// it dies they fail at once with KindUnavailable. On error nothing is left
// running. ctx bounds the start and the Info call, not the plugin's life.
func (h *Host) LaunchManager(ctx context.Context, path string) (kvcache.Manager, *Process, error) {
	raw, proc, err := h.launch(ctx, path, pluginrpc.ManagerPluginName)
	if err != nil {
		return nil, nil, err
	}
	m := raw.(*pluginrpc.ManagerClient)
	var info kvcache.Info
	err = h.bounded(ctx, proc, "Info", func(ctx context.Context) (err error) { info, err = m.Info(ctx); return err })
	if err == nil {
		err = checkProtocols(info.Protocols)
	}
	if err != nil {
		proc.Kill()
		return nil, nil, launchError(path, "cache manager", err)
	}
	h.logger.Info("plugin ready", "kind", pluginrpc.ManagerPluginName, "path", path, "pid", proc.pid,
		"name", info.Name, "version", info.Version, "protocols", info.Protocols,
		"protocol", proc.client.NegotiatedVersion(), "features", proc.agreed, "plugin_build", proc.contract.Build,
		"mixers", info.Capabilities.Mixers, "prefix_reuse", info.Capabilities.PrefixReuse,
		"host_tier", info.Capabilities.HostTier, "ssm_state", info.Capabilities.SSMState,
		"ssm_reuse", info.Capabilities.SSMReuse, "cache_salt", info.Capabilities.CacheSalt, "kv_events", info.Capabilities.KVEvents)
	return m, proc, nil
}

// LaunchWorker starts the worker plugin at path; see LaunchManager.
func (h *Host) LaunchWorker(ctx context.Context, path string) (worker.Worker, *Process, error) {
	raw, proc, err := h.launch(ctx, path, pluginrpc.WorkerPluginName)
	if err != nil {
		return nil, nil, err
	}
	w := raw.(*pluginrpc.WorkerClient)
	var info worker.Info
	err = h.bounded(ctx, proc, "Info", func(ctx context.Context) (err error) { info, err = w.Info(ctx); return err })
	if err == nil {
		err = checkProtocols(info.Protocols)
	}
	if err != nil {
		proc.Kill()
		return nil, nil, launchError(path, "worker", err)
	}
	h.logger.Info("plugin ready", "kind", pluginrpc.WorkerPluginName, "path", path, "pid", proc.pid,
		"name", info.Name, "version", info.Version, "protocols", info.Protocols,
		"protocol", proc.client.NegotiatedVersion(), "features", proc.agreed, "plugin_build", proc.contract.Build,
		"device", info.Device, "mixers", info.Mixers, "memory_bytes", info.MemoryBytes, "free_bytes", info.FreeBytes)
	return w, proc, nil
}

// ManagerInstance returns a further manager served by proc, the process
// behind of (a client LaunchManager returned): one process serves every
// pipeline stage (pluginrpc.InstancesProtocol). The instance is checked as
// a launch is (Info, protocol). It fails with kvcache.KindUnsupported when
// of is not a plugin client.
func (h *Host) ManagerInstance(ctx context.Context, of kvcache.Manager, proc *Process) (kvcache.Manager, error) {
	first, ok := of.(*pluginrpc.ManagerClient)
	if !ok {
		return nil, kvcache.Errorf(kvcache.KindUnsupported, "%T is not a plugin client", of)
	}
	m, err := first.NewInstance()
	if err != nil {
		return nil, err
	}
	var info kvcache.Info
	err = h.bounded(ctx, proc, "Info", func(ctx context.Context) (err error) { info, err = m.Info(ctx); return err })
	if err == nil {
		err = checkProtocols(info.Protocols)
	}
	if err != nil {
		return nil, launchError(proc.path, "cache manager instance", err)
	}
	h.logger.Debug("plugin instance ready", "kind", pluginrpc.ManagerPluginName, "path", proc.path, "pid", proc.pid)
	return m, nil
}

// WorkerInstance is ManagerInstance for workers.
func (h *Host) WorkerInstance(ctx context.Context, of worker.Worker, proc *Process) (worker.Worker, error) {
	first, ok := of.(*pluginrpc.WorkerClient)
	if !ok {
		return nil, kvcache.Errorf(kvcache.KindUnsupported, "%T is not a plugin client", of)
	}
	w, err := first.NewInstance()
	if err != nil {
		return nil, err
	}
	var info worker.Info
	err = h.bounded(ctx, proc, "Info", func(ctx context.Context) (err error) { info, err = w.Info(ctx); return err })
	if err == nil {
		err = checkProtocols(info.Protocols)
	}
	if err != nil {
		return nil, launchError(proc.path, "worker instance", err)
	}
	h.logger.Debug("plugin instance ready", "kind", pluginrpc.WorkerPluginName, "path", proc.path, "pid", proc.pid)
	return w, nil
}

// startTimeout is the bound of a start: StartTimeout, or DefaultStartTimeout.
func (h *Host) startTimeout() time.Duration {
	if h.StartTimeout > 0 {
		return h.StartTimeout
	}
	return DefaultStartTimeout
}

// bounded runs call, a launch's first call on proc, within the start
// timeout. A plugin that does not answer in time is hung: it is killed
// (Abort), and the error is of kind KindUnavailable, as a dead plugin's
// (the engine starts it again).
func (h *Host) bounded(ctx context.Context, proc *Process, what string, call func(context.Context) error) error {
	bound := h.startTimeout()
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	err := call(cctx)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		proc.Abort()
		return kvcache.Errorf(kvcache.KindUnavailable, "plugin %s (pid %d) did not answer %s within the start timeout of %v: killed it",
			proc.path, proc.pid, what, bound)
	}
	return err
}

func checkProtocols(protocols []int) error {
	if slices.Contains(protocols, kvcache.ProtocolVersion) {
		return nil
	}
	return fmt.Errorf("Info.Protocols = %v does not include %d, the only protocol this kvx speaks: %w",
		protocols, kvcache.ProtocolVersion, ErrProtocol)
}

// launchError explains a failed Info. A plugin that does not serve the
// asked-for kind answers KindUnsupported (a worker asked to be a manager).
func launchError(path, what string, err error) error {
	if kvcache.KindOf(err) == kvcache.KindUnsupported {
		return fmt.Errorf("plugin %s does not serve a %s: %w", path, what, err)
	}
	return fmt.Errorf("plugin %s as %s: %w", path, what, err)
}

// launch starts path and dispenses name. The process is tracked before any
// call, so Close kills it even while a launch is in progress.
func (h *Host) launch(ctx context.Context, path, name string) (any, *Process, error) {
	if err := executable(path); err != nil {
		return nil, nil, fmt.Errorf("plugin %s: %w", path, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("plugin %s: %w", path, err)
	}
	ours := h.ours()
	timeout := h.startTimeout()
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(dl), time.Millisecond))
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, ErrClosed
	}
	if h.socketDir == "" {
		dir, err := os.MkdirTemp("", "kvx-plugins-")
		if err != nil {
			h.mu.Unlock()
			return nil, nil, fmt.Errorf("plugin %s: socket directory: %w", path, err)
		}
		h.socketDir = dir
	}
	cmd := exec.Command(path)
	cmd.Env = append(inheritedEnv(os.Environ()), pluginrpc.LogLevelEnv+"="+levelName(h.logger))
	if n := h.threads(name); n > 0 {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(n))
	}
	parentDeathSignal(cmd)
	proc := &Process{host: h, path: path}
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  pluginrpc.Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{ours.Protocol: pluginrpc.HostPlugins(h.clientOptions()...)[pluginrpc.Protocol]},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           h.logger.Named(filepath.Base(path)),
		AutoMTLS:         h.AutoMTLS,
		StartTimeout:     timeout,
		GRPCDialOptions:  pluginrpc.DialOptions(),
		// The process runs in a group of its own (groupRunner), and its
		// sockets go to a directory only we can enter, removed by Close
		// even when a plugin was killed before it could remove its own.
		RunnerFunc:       runnerFunc(cmd, &proc.runner, &proc.mu),
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: h.socketDir},
	}
	if err := h.reattach(cfg, path); err != nil { // a plugin in debug mode (reattach.go)
		h.mu.Unlock()
		return nil, nil, err
	}
	client := plugin.NewClient(cfg)
	proc.client = client
	h.procs[proc] = struct{}{}
	h.mu.Unlock()

	fail := func(err error) (any, *Process, error) {
		proc.Abort()
		return nil, nil, fmt.Errorf("plugin %s: %w", path, err)
	}
	rpc, err := startClient(ctx, client, proc) // starts the process and connects
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case strings.Contains(err.Error(), goPluginStartTimeout):
			err = fmt.Errorf("no handshake within the start timeout of %v (%w): %v", timeout, ErrStartTimeout, err)
		default:
			// A process killed while it started (before its handshake) died,
			// as a plugin can at any time: a restart may start it again.
			// One that ended by itself without a handshake is not a plugin.
			if how, killed := proc.killedFromOutside(); killed {
				err = fmt.Errorf("the process ended (%s) before its handshake (%w): %v", how, kvcache.ErrUnavailable, err)
			} else {
				err = startError(err, ours)
			}
		}
		return fail(err)
	}
	proc.rpc = rpc
	proc.mu.Lock()
	if proc.runner != nil {
		proc.pid = proc.runner.Pid()
	} else if rc := client.ReattachConfig(); rc != nil {
		proc.pid = rc.Pid // a plugin attached to
	}
	proc.mu.Unlock()
	raw, err := rpc.Dispense(name)
	if err != nil {
		return fail(fmt.Errorf("dispense %s: %w", name, err))
	}
	var negotiate func(context.Context, pluginrpc.Contract) (pluginrpc.Contract, error)
	switch c := raw.(type) {
	case *pluginrpc.ManagerClient:
		proc.done, negotiate = c.Done(), c.Negotiate
	case *pluginrpc.WorkerClient:
		proc.done, negotiate = c.Done(), c.Negotiate
	default:
		return fail(fmt.Errorf("dispense %s: got %T", name, raw))
	}
	err = h.bounded(ctx, proc, "Hello", func(ctx context.Context) (err error) {
		proc.contract, err = negotiate(ctx, ours)
		return err
	})
	if err != nil {
		if errors.Is(err, pluginrpc.ErrMismatch) {
			err = fmt.Errorf("%w: %w", err, ErrProtocol)
		}
		return fail(err)
	}
	proc.agreed, _ = pluginrpc.Negotiate(ours, proc.contract)
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	return raw, proc, nil
}

// ours is what this host says in Hello.
func (h *Host) ours() pluginrpc.Contract {
	if h.contract != nil {
		return *h.contract
	}
	return pluginrpc.Current()
}

// goPluginStartTimeout is go-plugin's error text for a plugin that did not
// complete its handshake within the start timeout (TestStartTimeout pins
// it against the go-plugin in go.mod).
const goPluginStartTimeout = "timeout while waiting for plugin to start"

// startClient starts client's process and connects, or gives up when ctx
// ends: it kills the process group then (go-plugin itself would wait for
// its start timeout), and returns ctx's error.
func startClient(ctx context.Context, client *plugin.Client, proc *Process) (plugin.ClientProtocol, error) {
	type started struct {
		rpc plugin.ClientProtocol
		err error
	}
	ch := make(chan started, 1)
	go func() {
		rpc, err := client.Client()
		ch <- started{rpc, err}
	}()
	select {
	case s := <-ch:
		return s.rpc, s.err
	case <-ctx.Done():
		proc.killGroup() // go-plugin's start returns once the process is gone
		return nil, ctx.Err()
	}
}

// levelName returns the name of l's level for a plugin's environment.
func levelName(l hclog.Logger) string {
	lvl := l.GetLevel()
	if lvl == hclog.NoLevel || lvl == hclog.Off {
		return "info"
	}
	return strings.ToLower(lvl.String())
}

// Close kills every plugin process this host launched, waits until they are
// gone and removes their socket directory; launches after Close fail with
// ErrClosed. It also ends signal handling. Close is idempotent.
func (h *Host) Close() {
	h.mu.Lock()
	h.closed = true
	if h.sigStop != nil {
		close(h.sigStop)
		h.sigStop = nil
	}
	procs := make([]*Process, 0, len(h.procs))
	for p := range h.procs {
		procs = append(procs, p)
	}
	socketDir := h.socketDir
	h.socketDir = ""
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(p.Kill)
	}
	wg.Wait()
	if socketDir != "" {
		_ = os.RemoveAll(socketDir)
	}
}

// HandleSignals makes SIGINT and SIGTERM kill every plugin (Close) and then
// end this process the way the signal would have. Call it once, early, in
// programs that do not handle those signals themselves; a program that does
// must call Close from its own handler instead. Close stops the handling.
func (h *Host) HandleSignals() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sigStop != nil || h.closed {
		return
	}
	stop := make(chan struct{})
	h.sigStop = stop
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		defer signal.Stop(ch)
		select {
		case <-stop:
		case sig := <-ch:
			h.logger.Info("signal received: stopping plugins", "signal", sig.String())
			h.Close()
			signal.Reset(sig)
			if self, err := os.FindProcess(os.Getpid()); err == nil {
				_ = self.Signal(sig) // default action now: the process ends
			}
		}
	}()
}

// Found is one plugin binary found by Plugins.
type Found struct {
	Name string // file name, such as "kvx-cachemgr-v1"
	Path string
	// Shadowed is set when a binary of the same name comes earlier in the
	// search path (Find would pick that one).
	Shadowed bool
	// Kind is pluginrpc.ManagerPluginName or pluginrpc.WorkerPluginName;
	// empty when the binary answered neither.
	Kind    string
	Manager *kvcache.Info // when Kind is ManagerPluginName
	Worker  *worker.Info  // when Kind is WorkerPluginName
	// Contract is what the plugin speaks (its Hello, or only the protocol
	// of a handshake refused for it); nil when unknown.
	Contract *pluginrpc.Contract
	Err      error // why it could not be described
}

// parentDeathSignal is setParentDeathSignal; tests turn it off to see
// HandleSignals work alone.
var parentDeathSignal = setParentDeathSignal

// ProbeTimeout bounds how long Plugins spends on one binary.
const ProbeTimeout = 10 * time.Second

// Plugins lists every executable named kvx-* in SearchPath, in search
// order, and describes each by launching it, asking Info as a cache manager
// and then as a worker, and killing it. A binary that is not a kvx plugin,
// or that this kvx refuses (another wire protocol, a required feature missing,
// not contract v1), gets Err set (the Info it gave, if any,
// is kept); nothing is left running.
func (h *Host) Plugins() []Found {
	var found []Found
	seen := map[string]bool{}
	for _, dir := range h.SearchPath() {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			path := filepath.Join(dir, name)
			if !strings.HasPrefix(name, NamePrefix) || executable(path) != nil {
				continue
			}
			f := Found{Name: name, Path: path, Shadowed: seen[name]}
			seen[name] = true
			h.probe(&f)
			found = append(found, f)
		}
	}
	return found
}

// probe launches f's binary once and asks Info as a cache manager, then,
// if it serves none, as a worker.
func (h *Host) probe(f *Found) {
	ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
	defer cancel()
	raw, proc, err := h.launch(ctx, f.Path, pluginrpc.ManagerPluginName)
	if err != nil {
		f.Err = err
		if me := (*pluginrpc.MismatchError)(nil); errors.As(err, &me) {
			f.Contract = &me.Plugin
		}
		return
	}
	defer proc.Kill()
	f.Contract = &proc.contract
	minfo, err := raw.(*pluginrpc.ManagerClient).Info(ctx)
	if err == nil {
		f.Kind, f.Manager, f.Err = pluginrpc.ManagerPluginName, &minfo, checkProtocols(minfo.Protocols)
		return
	}
	if kvcache.KindOf(err) != kvcache.KindUnsupported {
		f.Err = launchError(f.Path, "cache manager", err)
		return
	}
	raw, err = proc.rpc.Dispense(pluginrpc.WorkerPluginName)
	if err != nil {
		f.Err = fmt.Errorf("plugin %s: dispense %s: %w", f.Path, pluginrpc.WorkerPluginName, err)
		return
	}
	winfo, err := raw.(*pluginrpc.WorkerClient).Info(ctx)
	if err != nil {
		f.Err = fmt.Errorf("plugin %s serves neither a cache manager nor a worker: %w", f.Path, err)
		return
	}
	f.Kind, f.Worker, f.Err = pluginrpc.WorkerPluginName, &winfo, checkProtocols(winfo.Protocols)
}

// closingManager is a plugin client that stops its process on Close. It
// keeps the client's kvcache.Suspender, EventReporter and Forker.
type closingManager struct {
	suspendingManager
	proc *Process
}

// suspendingManager is what a manager plugin client implements.
type suspendingManager interface {
	kvcache.Manager
	kvcache.Suspender
	kvcache.EventReporter
	kvcache.Forker
}

func (m closingManager) Close() error { m.proc.Kill(); return nil }

type closingWorker struct {
	worker.Worker
	proc *Process
}

func (w closingWorker) Close() error { w.proc.Kill(); return nil }

// ManagerFactory returns a factory that launches the cache-manager plugin at
// path on every call, for suites that want a fresh plugin each time (the
// conformance suite). Each manager it returns implements io.Closer, which
// stops its process. A failed launch is passed to onErr and yields nil.
func (h *Host) ManagerFactory(ctx context.Context, path string, onErr func(error)) func() kvcache.Manager {
	return func() kvcache.Manager {
		m, proc, err := h.LaunchManager(ctx, path)
		if err != nil {
			onErr(err)
			return nil
		}
		return closingManager{m.(*pluginrpc.ManagerClient), proc}
	}
}

// WorkerFactory is ManagerFactory for a worker plugin.
func (h *Host) WorkerFactory(ctx context.Context, path string, onErr func(error)) func() worker.Worker {
	return func() worker.Worker {
		w, proc, err := h.LaunchWorker(ctx, path)
		if err != nil {
			onErr(err)
			return nil
		}
		return closingWorker{w, proc}
	}
}

// inheritedEnv is what of the host's environment a plugin process gets:
// the GPU runtime's variables (CUDA_*, NVIDIA_*, NCCL_*: visible devices,
// the profilers' injection, CUDA_KVX_PROFILE), Nsight Systems' session
// (NSYS_*, QUADD_*: without them `nsys profile kvx run` traces no kernel of
// the worker it injected into), where shared libraries come from
// (LD_LIBRARY_PATH, and LD_PRELOAD, how Nsight attaches) and TMPDIR.
// Nothing else: a plugin's behaviour comes from its configuration, not
// from the shell kvx ran in (KVX_* variables are config keys of kvx).
func inheritedEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "CUDA_"), strings.HasPrefix(name, "NVIDIA_"), strings.HasPrefix(name, "NCCL_"),
			strings.HasPrefix(name, "NSYS_"), strings.HasPrefix(name, "QUADD_"),
			name == "LD_LIBRARY_PATH", name == "LD_PRELOAD", name == "TMPDIR":
			out = append(out, kv)
		}
	}
	return out
}
