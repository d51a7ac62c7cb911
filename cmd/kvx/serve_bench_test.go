package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/workload"
)

// BenchmarkServeOverhead: the same requests (64 prompts of 512 token ids,
// 32 tokens each, all at once, on the sim device) through engine.Run, as
// kvx run replays them, and through kvx serve over loopback HTTP by 64
// clients, with the plugins in-process and as processes. It reports the
// wall milliseconds per request of each and the server's overhead per
// request (serve - run). Neither side counts the engine's setup (the
// plugins' start and Configure): Run's wall has it, so a StartLive and
// Stop of the same config, timed just before, is subtracted from it.
func BenchmarkServeOverhead(b *testing.B) {
	for _, iso := range []string{"inprocess", "plugin"} {
		b.Run("isolation="+iso, func(b *testing.B) { benchServeOverhead(b, iso) })
	}
}

func benchServeOverhead(b *testing.B, isolation string) {
	const n, promptLen, maxTok = 64, 512, 32
	prompts := make([]workload.Prompt, n)
	bodies := make([]string, n)
	for i := range prompts {
		ids := make([]int32, promptLen)
		for j := range ids {
			ids[j] = int32((i*7919 + j*104729) % 128000)
		}
		prompts[i] = workload.Prompt{Tokens: ids, MaxTokens: maxTok}
		js, _ := json.Marshal(map[string]any{"prompt": ids, "max_tokens": maxTok})
		bodies[i] = string(js)
	}
	g := &globals{configs: []string{serveSim}, sets: []string{"isolation=" + isolation, "plugin_dirs=[" + binDir + "]"}, logLevel: "error"}
	var runS, serveS float64
	for b.Loop() {
		cfg, err := loadConfig(g, nil)
		if err != nil {
			b.Fatal(err)
		}
		res, err := setup.Resolve(cfg, "bench", false)
		if err != nil {
			b.Fatal(err)
		}
		res.Spec.Workload, err = workload.FromPrompts(prompts, res.Model.Vocab)
		if err != nil {
			b.Fatal(err)
		}
		l := setup.NewLauncher(cfg, builtin.Registry(), nil)
		t0 := time.Now()
		lv, err := engine.StartLive(context.Background(), res.Spec, l)
		if err != nil {
			b.Fatal(err)
		}
		lv.Stop()
		setupS := time.Since(t0).Seconds()
		l.Close()
		l = setup.NewLauncher(cfg, builtin.Registry(), nil)
		t0 = time.Now()
		if _, err := engine.Run(context.Background(), res.Spec, l); err != nil {
			b.Fatal(err)
		}
		runS += max(0, time.Since(t0).Seconds()-setupS)
		l.Close()

		b.StopTimer()
		base := startServeB(b, g)
		b.StartTimer()
		t0 = time.Now()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(bodies[i]))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("status %d", resp.StatusCode)
				}
			})
		}
		wg.Wait()
		serveS += time.Since(t0).Seconds()
	}
	per := func(s float64) float64 { return s / float64(b.N) / n * 1e3 }
	b.ReportMetric(per(runS), "run-ms/req")
	b.ReportMetric(per(serveS), "serve-ms/req")
	b.ReportMetric(per(serveS)-per(runS), "overhead-ms/req")
}

// startServeB is startServe for a benchmark: the server stops at cleanup.
func startServeB(b *testing.B, g *globals) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- runServe(ctx, g, &serveOpts{}, ln, func(a string) { ready <- a }) }()
	select {
	case a := <-ready:
		b.Cleanup(func() { cancel(); <-done })
		return fmt.Sprintf("http://%s", a)
	case err := <-done:
		b.Fatal(err)
	}
	return ""
}
