package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/serve"
)

type serveOpts struct {
	host       string
	port       int
	maxWaiting int
	maxBody    int64
	model      string
	drain      time.Duration
	template   string
}

func newServeCmd(g *globals) *cobra.Command {
	o := &serveOpts{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the configured engine over an OpenAI-compatible HTTP API",
		Long: `Serve the configured engine over HTTP, OpenAI-compatible:
  POST /v1/completions, POST /v1/chat/completions   (JSON, or SSE with "stream": true)
  GET /v1/models, GET /health, GET /metrics          (Prometheus, kvx: names after vLLM's)
  POST /reset_prefix_cache                           (vLLM's: drop every cached prefix block; 409 while busy)
on the same engine loop as kvx run, with requests arriving from HTTP instead
of a workload (the config's workload section is not used). It listens on
loopback unless --host says otherwise.

Sampling is greedy and runs to max_tokens. Chat messages go through the
checkpoint's chat template (chat_template.jinja, else tokenizer_config.json's
chat_template; Jinja, rendered as transformers does), or the file given with
--chat-template; without either, through a plain template, one
"role: content" line per message and then "assistant:".
On device sim the tokens are placeholders and the latency metrics are
simulated seconds; on cpu (or cuda) they are the model's tokens and wall
seconds.

A plugin that dies (exit, kill -9, or a call past its plugin_timeouts
deadline) is restarted (plugin_restarts.backoff, doubling to
plugin_restarts.max_backoff) and its requests recomputed; /health answers
503 "restarting" meanwhile. When the restart budget (plugin_restarts.max) is
spent, or a manager reports a broken invariant, the requests in flight fail
with an error and kvx serve exits 1.

SIGINT or SIGTERM drains: new requests get 503, the ones in flight finish
(at most --drain-timeout), then kvx serve exits 0. A second signal exits at
once, unless it is the first one again within a second (timeout and a kill
of the process group deliver it twice).

Exit status: 0 after SIGINT/SIGTERM, 1 when the engine failed, 2 for bad
configuration or flags.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.Itoa(o.port)))
			if err != nil {
				return usageErr(fmt.Errorf("serve: %w", err))
			}
			stopIsNormal(cmd.Context()) // SIGINT and SIGTERM shut the server down: exit 0
			return runServe(cmd.Context(), g, o, ln, func(addr string) {
				fmt.Fprintf(cmd.ErrOrStderr(), "kvx serve: listening on http://%s\n", addr)
			})
		},
	}
	cmd.Flags().StringVar(&o.host, "host", "127.0.0.1", "address to listen on")
	cmd.Flags().IntVar(&o.port, "port", 8000, "port to listen on (0: any free port)")
	cmd.Flags().IntVar(&o.maxWaiting, "max-waiting", serve.DefaultMaxWaiting, "requests without a first token beyond which new ones get 429")
	cmd.Flags().Int64Var(&o.maxBody, "max-body-bytes", serve.DefaultMaxBodyBytes, "largest request body (413 above)")
	cmd.Flags().StringVar(&o.model, "served-model-name", "", "the model id clients name (default: the config's served_model_name, else its model)")
	cmd.Flags().StringVar(&o.template, "chat-template", "", "a Jinja chat template file, instead of the checkpoint's chat_template")
	cmd.Flags().DurationVar(&o.drain, "drain-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long the requests in flight may take to finish")
	return cmd
}

// runServe builds the live engine and serves it on ln until ctx ends (or
// the engine fails). ready is called with the address once it serves.
func runServe(ctx context.Context, g *globals, o *serveOpts, ln net.Listener, ready func(addr string)) error {
	defer ln.Close()
	if len(g.configs) == 0 {
		return usageErr(errors.New("serve: --config FILE is required (e.g. scenarios/cpu-llama.yaml)"))
	}
	if o.drain < 0 {
		return usageErr(fmt.Errorf("serve: --drain-timeout %v: must be >= 0 (0: cut the requests in flight at once)", o.drain))
	}
	cfg, err := loadConfig(g, nil)
	if err != nil {
		return usageErr(err)
	}
	s, err := serve.Open(cfg, builtin.Registry(), serve.SessionOptions{Model: o.model, ChatTemplate: o.template,
		MaxWaiting: o.maxWaiting, MaxBodyBytes: o.maxBody, Drain: o.drain, Log: g.logger(), Notices: os.Stderr})
	if err != nil {
		return usageErr(err)
	}
	if err := s.Serve(ctx, ln, ready); err != nil {
		return engineErr(err)
	}
	return nil
}
