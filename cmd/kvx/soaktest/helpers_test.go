package soaktest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/core/testbin"

	"github.com/kvx-dev/kvx/cmd/kvx/internal/servetest"
)

// binDir holds kvx and every plugin binary, built (or linked) once.
var binDir string

func TestMain(m *testing.M) { testbin.Main(m, &binDir) }

// serveSim is cmd/kvx's kvx serve scenario on the sim device.
const serveSim = "../testdata/serve-sim.yaml"

// served is a kvx serve process (servetest.Served).
type served = servetest.Served

// startServed starts kvx serve on a loopback port and returns once it
// listens.
func startServed(t *testing.T, args ...string) *served {
	t.Helper()
	return servetest.Start(t, exec.Command(filepath.Join(binDir, "kvx"), append([]string{"serve", "-c", serveSim, "--port", "0"}, args...)...))
}

// metricsOf scrapes /metrics and returns, per metric name, the sum of its
// series' values (the text format's sample lines; histograms' own
// _bucket, _sum and _count names stay apart).
func metricsOf(t *testing.T, base string) map[string]float64 {
	t.Helper()
	m, err := scrape(http.DefaultClient, base)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// scrape reads base's /metrics into a map of each series' sum over its
// labels; it is safe off the test's goroutine (no t.Fatal).
func scrape(client *http.Client, base string) (map[string]float64, error) {
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return nil, fmt.Errorf("/metrics line %q: %v", line, err)
		}
		m[name] += v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("/metrics: %v", err)
	}
	return m, nil
}

// value is metric name of m; a metric /metrics lacks fails the test.
func value(t *testing.T, m map[string]float64, name string) float64 {
	t.Helper()
	v, ok := m[name]
	if !ok {
		t.Fatalf("/metrics has no %s", name)
	}
	return v
}

// pluginPIDs lists the live processes of this package's plugin binaries.
func pluginPIDs(t *testing.T) []int { return servetest.PluginPIDs(t, binDir) }

// noPluginLeft fails the test when a plugin process outlives kvx for 5 s.
func noPluginLeft(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(pluginPIDs(t)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if pids := pluginPIDs(t); len(pids) > 0 {
		t.Errorf("plugin processes left: %v", pids)
	}
}

// completes checks one 200 answer: want tokens, streamed to [DONE] with
// the usage chunk and no error event, or as one JSON object with usage.
func completes(resp *http.Response, stream bool, want int) (problem string) {
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return "reading: " + err.Error()
	}
	if resp.StatusCode != 200 {
		return fmt.Sprintf("status %d: %s", resp.StatusCode, data)
	}
	var usage struct {
		CompletionTokens int `json:"completion_tokens"`
	}
	if !stream {
		var v struct {
			Usage *json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal(data, &v); err != nil || v.Usage == nil {
			return fmt.Sprintf("answer %s: %v", data, err)
		}
		_ = json.Unmarshal(*v.Usage, &usage)
	} else {
		done := false
		for line := range strings.SplitSeq(string(data), "\n") {
			d, ok := strings.CutPrefix(line, "data: ")
			switch {
			case !ok:
			case d == "[DONE]":
				done = true
			case strings.Contains(d, `"error"`):
				return "error event " + d
			case strings.Contains(d, `"usage"`):
				var v struct {
					Usage json.RawMessage `json:"usage"`
				}
				_ = json.Unmarshal([]byte(d), &v)
				_ = json.Unmarshal(v.Usage, &usage)
			}
		}
		if !done {
			return "no [DONE]: " + string(data)
		}
	}
	if usage.CompletionTokens != want {
		return fmt.Sprintf("%d completion tokens, want %d", usage.CompletionTokens, want)
	}
	return ""
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	return s[min(len(s)-1, int(p*float64(len(s))))]
}
