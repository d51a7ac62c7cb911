package engine

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress is a progress bar over finished requests with live counters. A nil
// *progress does nothing.
type progress struct {
	bar  *progressbar.ProgressBar
	last time.Time
}

func newProgress(w io.Writer, total int, variant string) *progress {
	bar := progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(variant),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(24),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
	return &progress{bar: bar}
}

// tick counts one request as done (finished or rejected).
func (p *progress) tick(e *Engine) {
	if p == nil {
		return
	}
	_ = p.bar.Add(1)
}

// update refreshes the live counters at most a few times a second.
func (p *progress) update(e *Engine) {
	if p == nil || time.Since(p.last) < 250*time.Millisecond {
		return
	}
	p.last = time.Now()
	p.bar.Describe(fmt.Sprintf("%s step %d run %d wait %d sim %.1fs", e.spec.Variant, e.steps, e.sched.Running(), e.sched.Waiting(), float64(e.now)/1e9))
}

func (p *progress) finish(e *Engine) {
	if p == nil {
		return
	}
	_ = p.bar.Finish()
}
