package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/plugins/model/chat"
)

// SessionOptions are what kvx serve's flags add to the configuration.
type SessionOptions struct {
	Model        string        // the served model's id; "" for served_model_name, else model
	ChatTemplate string        // a Jinja template file; "" for the checkpoint's
	MaxWaiting   int           // Options.MaxWaiting
	MaxBodyBytes int64         // Options.MaxBodyBytes
	Drain        time.Duration // on ctx's end, how long the requests in flight may take
	Log          hclog.Logger
	Notices      io.Writer // what the server says to its operator (kvx serve: stderr)
}

// Session is one kvx serve: a configuration prepared and checked (Open),
// then served until its context ends or the engine fails (Serve).
type Session struct {
	p    *setup.Prepared
	opt  Options
	o    SessionOptions
	pub  *Publisher // nil without zmq KV events
	done bool
}

// Open prepares cfg for serving with reg (setup.Prepare: every check a run
// makes), the model's tokenizer, EOS ids and chat template, the fault
// injections of engine.FaultEnv (tests only, and only with isolation
// plugin: it kills plugin processes), and the KV events publisher when
// kv_events_config asks for zmq. Its errors are the configuration's; the
// caller closes a Session it does not Serve.
func Open(cfg *config.Config, reg *registry.Registry, o SessionOptions) (*Session, error) {
	res, err := setup.Prepare(cfg, "serve", reg)
	if err != nil {
		return nil, err
	}
	tok, noTok, err := setup.TokenizerFor(cfg, res.Model)
	if err != nil {
		return nil, err
	}
	eos, err := setup.EOS(cfg, res.Model)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	ckpt := ""
	if st, err := os.Stat(cfg.Model); err == nil && st.IsDir() {
		ckpt = cfg.Model
	}
	tmpl, err := chat.Load(ckpt, o.ChatTemplate)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if tmpl != nil && tok == nil {
		return nil, fmt.Errorf("serve: chat template %s: the model has no tokenizer to encode its prompts (%s)", tmpl.Source, noTok)
	}
	log := o.Log
	res.Spec.Workload.RetentionPriority, res.Spec.Workload.RetentionDuration = cfg.Workload.Retention()
	res.Spec.Log = log
	if tmpl != nil {
		log.Info("chat template", "source", tmpl.Source)
	}
	// Unlike kvx run, a server keeps every core on the sim device too: the
	// HTTP connections run beside the engine loop.
	if v, ok := os.LookupEnv(engine.FaultEnv); ok {
		faults, err := engine.ParseFaults(v)
		if err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		if cfg.Isolation != "plugin" {
			return nil, fmt.Errorf("serve: %s kills plugin processes; isolation is %q, want plugin", engine.FaultEnv, cfg.Isolation)
		}
		// Never quiet: this kills the server's own plugins.
		fmt.Fprintf(o.Notices, "kvx serve: WARNING: %s=%q: FAULT INJECTION IS ON, plugins will be killed on purpose (for tests only)\n", engine.FaultEnv, v)
		log.Warn("FAULT INJECTION IS ON: plugins will be killed on purpose", "env", engine.FaultEnv, "faults", v)
		res.Spec.Faults = faults
	}
	name := o.Model
	if name == "" {
		name = cfg.ServedModelName
	}
	if name == "" {
		name = cfg.Model
	}
	s := &Session{p: res, o: o, opt: Options{
		Model: name, Vocab: res.Model.Vocab, MaxSeqLen: cfg.MaxSeqLen, NoTokenizer: noTok,
		Placeholder: !config.Computing(cfg.Device), SimClock: !config.Computing(cfg.Device),
		MaxWaiting: o.MaxWaiting, MaxBodyBytes: o.MaxBodyBytes, ChatTemplate: tmpl, EOS: eos,
	}}
	if tok != nil {
		s.opt.Tokenizer = tok
	}
	if ev := cfg.KVEvents; ev.EnableKVCacheEvents && ev.Publisher == "zmq" {
		pub, err := NewPublisher(EventsOptions{Endpoint: ev.Endpoint, ReplayEndpoint: ev.ReplayEndpoint, BufferSteps: ev.BufferSteps, Topic: ev.Topic})
		if err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		s.pub = pub
		res.Spec.KVEvents = pub
		fmt.Fprintf(o.Notices, "kvx serve: KV events on %s (replay %q)\n", ev.Endpoint, ev.ReplayEndpoint)
	}
	return s, nil
}

// Close releases what Open holds (the KV events publisher); Serve closes
// it too, after the engine stopped, so that what the engine reported goes
// out. Close after Serve does nothing.
func (s *Session) Close() {
	if s.pub != nil && !s.done {
		s.pub.Close()
	}
	s.done = true
}

// Serve starts the engine live and serves it on ln until ctx ends (a stop
// signal: new requests get 503 and the ones in flight get Drain to finish)
// or the engine fails; ready, when not nil, is called with the address
// once it serves. The engine outlives ctx's end for the drain; then it
// stops, the requests still in flight end with 503, and the server closes
// its connections. The error is the engine's, prefixed "serve: ": it did
// not start, a plugin's restart budget was spent, an invariant broke.
func (s *Session) Serve(ctx context.Context, ln net.Listener, ready func(addr string)) error {
	l := s.p.Launcher(s.o.Log)
	defer l.Close()
	defer s.Close() // before the launcher: what the engine reported goes out
	notices := s.o.Notices
	lv, err := engine.StartLive(context.WithoutCancel(ctx), s.p.Spec, l)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	h := New(lv, s.opt)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr().String())
	}
	drain := s.o.Drain
	var failed error
	select {
	case <-ctx.Done():
		// A stop signal: drain, within the timeout.
		if drain > 0 {
			fmt.Fprintf(notices, "kvx serve: %v: draining (new requests get 503; at most %v for the ones in flight)\n", context.Cause(ctx), drain)
		}
		dctx, cancel := context.WithTimeout(context.Background(), drain)
		go func() { // an engine that fails while draining ends the wait
			select {
			case <-lv.Done():
				cancel()
			case <-dctx.Done():
			}
		}()
		left := h.Drain(dctx)
		cancel()
		if left > 0 {
			fmt.Fprintf(notices, "kvx serve: drain timeout %v: %d requests still in flight are cut off\n", drain, left)
		}
		failed = lv.Err()
	case <-lv.Done():
		failed = lv.Err()
	case err := <-errc:
		failed = err
	}
	// Stop the engine: requests still in flight end with 503, then the
	// server closes its connections.
	_, stopErr := lv.Stop()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if failed == nil {
		failed = stopErr
	}
	if failed != nil && !errors.Is(failed, http.ErrServerClosed) {
		fmt.Fprintln(notices, "kvx serve: engine failed:", failed)
		return fmt.Errorf("serve: %w", failed)
	}
	return nil
}
