// Package pagecheck opens a kvx HTML report in headless Chromium, for tests:
// it collects the page's console errors, uncaught exceptions and network
// requests, and what every chart drew.
//
// Tests call Open; it skips the test when no Chromium is installed, unless
// the environment sets REQUIRE_CHROMIUM=1 (as .ci/run does), and then
// fails it instead.
package pagecheck

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Chart is what one Chart.js chart of the page drew.
type Chart struct {
	Title    string  `json:"title"`
	Type     string  `json:"type"`
	Width    float64 `json:"width"`  // the canvas, in CSS pixels
	Height   float64 `json:"height"` // the canvas, in CSS pixels
	Painted  bool    `json:"painted"`
	Datasets int     `json:"datasets"` // datasets with at least one value
	// YMax is the y axis's top; YTitle its title.
	YMax   float64 `json:"ymax"`
	YTitle string  `json:"ytitle"`
	// LegendOverlaps: the legend's box reaches into the plot area.
	LegendOverlaps bool `json:"legendOverlaps"`
	// BarValues: the plugin that writes values on bars is installed.
	BarValues bool `json:"barValues"`
}

// Page is what the browser saw.
type Page struct {
	// Errors are console errors and uncaught exceptions, in order.
	Errors []string
	// Requests are the URLs the page asked for beyond the file itself.
	Requests []string
	// Drawn is window.kvxCharts, the charts the page's script says it drew.
	Drawn int
	// Canvases is the number of canvas elements.
	Canvases int
	Charts   []Chart
}

// Binary returns the Chromium to run: $CHROMIUM_BIN, else the first of
// chromium, chromium-browser and google-chrome on the PATH; "" for none.
func Binary() string {
	if p := os.Getenv("CHROMIUM_BIN"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Open loads each HTML file of paths in a tab of one headless Chromium and
// reports what each tab saw once its page loaded. Without Chromium it
// skips t, or fails it when REQUIRE_CHROMIUM=1.
func Open(t testing.TB, paths ...string) []Page {
	t.Helper()
	bin := Binary()
	if bin == "" {
		msg := "no Chromium (chromium, chromium-browser or google-chrome on the PATH, or $CHROMIUM_BIN): install it with apt-get install -y chromium to check the HTML report in a browser"
		if os.Getenv("REQUIRE_CHROMIUM") == "1" {
			t.Fatalf("%s (REQUIRE_CHROMIUM=1)", msg)
		}
		t.Skip(msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.WindowSize(1400, 1000),
		chromedp.UserDataDir(t.TempDir()))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	browser, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	if err := chromedp.Do(browser); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", bin, err)
	}
	var pages []Page
	for _, path := range paths {
		pages = append(pages, openTab(t, browser, path))
	}
	return pages
}

// openTab loads path in a new tab of browser.
func openTab(t testing.TB, browser context.Context, path string) Page {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var p Page
	url := "file://" + abs
	listen := func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					if a.Description != "" {
						args = append(args, a.Description)
					} else {
						args = append(args, string(a.Value))
					}
				}
				p.Errors = append(p.Errors, "console."+string(ev.Type)+": "+strings.Join(args, " "))
			}
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil && d.Exception.Description != "" {
				msg += " " + d.Exception.Description
			}
			p.Errors = append(p.Errors, fmt.Sprintf("uncaught at %d:%d: %s", d.LineNumber+1, d.ColumnNumber+1, msg))
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.EntryLevelError {
				p.Errors = append(p.Errors, "log: "+ev.Entry.Text+" "+ev.Entry.URL)
			}
		case *network.EventRequestWillBeSent:
			if u := ev.Request.URL; u != url && !strings.HasPrefix(u, "data:") {
				p.Requests = append(p.Requests, u)
			}
		}
	}
	bctx, bcancel := chromedp.NewContext(browser, chromedp.WithListener(listen))
	defer bcancel()
	fail := func(err error) {
		t.Helper()
		t.Fatalf("chromium on %s: %v", path, err)
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitReady("body")); err != nil {
		fail(err)
	}
	drawn, err := chromedp.Run(bctx, chromedp.Evaluate[int](`window.kvxCharts || 0`))
	if err != nil {
		fail(err)
	}
	canvases, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('canvas').length`))
	if err != nil {
		fail(err)
	}
	charts, err := chromedp.Run(bctx, chromedp.Evaluate[[]Chart](chartsJS))
	if err != nil {
		fail(err)
	}
	mu.Lock()
	defer mu.Unlock()
	p.Drawn, p.Canvases, p.Charts = drawn, canvases, charts
	return p
}

// chartsJS describes every Chart.js chart of the page.
const chartsJS = `Object.values(typeof Chart === 'undefined' ? {} : Chart.instances).map(c => {
  const cv = c.canvas;
  const px = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
  let painted = false;
  for (let i = 3; i < px.length; i += 4) { if (px[i] !== 0) { painted = true; break; } }
  const y = c.scales.y || {};
  const lg = c.legend;
  return {
    title: String((c.options.plugins.title || {}).text || ''),
    type: c.config.type,
    width: cv.clientWidth, height: cv.clientHeight, painted: painted,
    datasets: c.data.datasets.filter(d => d.data.length > 0).length,
    ymax: y.max === undefined ? 0 : y.max,
    ytitle: String(((y.options || {}).title || {}).text || ''),
    legendOverlaps: !!(lg && lg.options.display && lg.height > 0 && lg.bottom > c.chartArea.top + 1),
    barValues: (c.config.plugins || []).some(p => p.id === 'kvxBarValues'),
  };
})`
