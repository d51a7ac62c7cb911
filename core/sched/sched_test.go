package sched

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestScript runs the scripts in testdata/ (rewrite with -rewrite). Commands:
//
//	new policy=P batch=N resident=N tokens=N seqlen=N seqtokens=N tpb=N draft=N blocks=N [chunked] [reuse]
//	add            input: one "id=N prompt=N new=N" per line
//	lookup         input: one "id=N tokens=N" per line (the fake cache's prefix hits)
//	schedule       one Schedule call: the step, the fake's ledger, the call counts
//	complete [drafts=N]  completes the oldest in-flight micro-batch
//	complete-item id=N accepted=N emitted=N   completes one in-flight item with these numbers
//	step [n=N] [drafts=N]  n times schedule + complete, one compact line each
//	run [drafts=N] [max=N] step until idle; prints the compact lines
//	deny id=N times=N  the fake denies the next asks of a sequence (fault injection)
//	abort id=N
//	state
//
// Compact items: p<id>@<pos>+<tokens> is a prefill chunk, g<id>@<pos>+1d<draft>
// a generation step, r<n> the reused tokens, * a sampling item.
func TestScript(t *testing.T) {
	// Only *.txt: rapid keeps its failure files under testdata/rapid.
	paths, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) { runScript(t, path) })
	}
}

func runScript(t *testing.T, path string) {
	var d *driver
	datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
		if td.Cmd != "new" && d == nil {
			td.Fatalf(t, "%s before new", td.Cmd)
		}
		out := runCmd(t, td, &d)
		if d != nil {
			d.f.check()
			if len(d.f.violations) > 0 || len(d.errs) > 0 {
				t.Errorf("%s: %s\nviolations: %v\nerrors: %v", td.Pos, td.Cmd, d.f.violations, d.errs)
				d.f.violations, d.errs = nil, nil
			}
		}
		return out
	})
}

func runCmd(t *testing.T, td *datadriven.TestData, dp **driver) string {
	d := *dp
	drafts := func() {
		if td.HasArg("drafts") {
			var n int
			td.ScanArgs(t, "drafts", &n)
			d.acceptDrafts = func(it Item) int { return min(n, it.Draft) }
		}
	}
	switch td.Cmd {
	case "new":
		cfg := Config{ChunkedPrefill: td.HasArg("chunked"), Reuse: td.HasArg("reuse")}
		var pol string
		var blocks int
		td.ScanArgs(t, "policy", &pol)
		td.ScanArgs(t, "batch", &cfg.MaxBatchSize)
		td.ScanArgs(t, "resident", &cfg.MaxResident)
		td.ScanArgs(t, "tokens", &cfg.MaxNumTokens)
		td.ScanArgs(t, "seqlen", &cfg.MaxSeqLen)
		td.ScanArgs(t, "seqtokens", &cfg.MaxSeqTokens)
		td.ScanArgs(t, "tpb", &cfg.TokensPerBlock)
		td.MaybeScanArgs(t, "draft", &cfg.Draft)
		td.ScanArgs(t, "blocks", &blocks)
		p, err := ParsePolicy(pol)
		if err != nil {
			return err.Error()
		}
		cfg.Policy = p
		nd, err := newDriver(cfg, blocks)
		if err != nil {
			return err.Error()
		}
		*dp = nd
		return "ok"
	case "add":
		for _, kv := range lines(t, td) {
			d.add(Request{ID: kvcache.SeqID(kv["id"]), Prompt: kv["prompt"], MaxNew: kv["new"]})
		}
		return fmt.Sprintf("waiting=%d", d.s.Waiting())
	case "lookup":
		for _, kv := range lines(t, td) {
			d.f.lookup[kvcache.SeqID(kv["id"])] = kv["tokens"]
		}
		return "ok"
	case "schedule":
		before := d.f.calls
		st := d.schedule()
		return formatStep(st) + d.f.String() + "\n" + d.callsSince(before) + "\n" + d.counters()
	case "complete":
		drafts()
		if len(d.queue) == 0 {
			return "nothing in flight"
		}
		return strings.Join(d.completeOldest(), "\n") + "\n" + d.f.String() + "\n" + d.counters()
	case "complete-item":
		var id, acc, em int
		td.ScanArgs(t, "id", &id)
		td.ScanArgs(t, "accepted", &acc)
		td.ScanArgs(t, "emitted", &em)
		it, ok := d.takeItem(kvcache.SeqID(id))
		if !ok {
			fin := d.s.Complete(kvcache.SeqID(id), acc, em)
			return fmt.Sprintf("no item in flight; Complete = %t\n%s", fin, d.counters())
		}
		return d.complete(it, acc, em) + "\n" + d.f.String() + "\n" + d.counters()
	case "step", "run":
		drafts()
		n, limit := 1, 1000
		td.MaybeScanArgs(t, "n", &n)
		td.MaybeScanArgs(t, "max", &limit)
		var b strings.Builder
		for i := 0; ; i++ {
			if td.Cmd == "step" && i == n {
				break
			}
			if td.Cmd == "run" && d.s.Idle() {
				break
			}
			if i == limit {
				b.WriteString("STEP LIMIT\n")
				break
			}
			st := d.schedule()
			b.WriteString(d.compact(st))
			d.completeOldest()
		}
		b.WriteString(d.f.String() + "\n" + d.counters())
		return b.String()
	case "deny":
		var id, n int
		td.ScanArgs(t, "id", &id)
		td.ScanArgs(t, "times", &n)
		d.f.deny[kvcache.SeqID(id)] = n
		return "ok"
	case "abort":
		var id int
		td.ScanArgs(t, "id", &id)
		d.abort(kvcache.SeqID(id))
		return d.f.String() + "\n" + d.counters()
	case "state":
		return d.f.String() + "\n" + d.counters()
	}
	td.Fatalf(t, "unknown command %q", td.Cmd)
	return ""
}

func lines(t *testing.T, td *datadriven.TestData) []map[string]int {
	var out []map[string]int
	for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
		kv := map[string]int{}
		for _, f := range strings.Fields(line) {
			k, v, ok := strings.Cut(f, "=")
			n, err := strconv.Atoi(v)
			if !ok || err != nil {
				td.Fatalf(t, "bad field %q", f)
			}
			kv[k] = n
		}
		out = append(out, kv)
	}
	return out
}

// takeItem removes id's item from the in-flight micro-batches.
func (d *driver) takeItem(id kvcache.SeqID) (Item, bool) {
	for bi, batch := range d.queue {
		for i, it := range batch {
			if it.ID == id {
				d.queue[bi] = append(batch[:i:i], batch[i+1:]...)
				if len(d.queue[bi]) == 0 {
					d.queue = append(d.queue[:bi], d.queue[bi+1:]...)
				}
				return it, true
			}
		}
	}
	return Item{}, false
}

func (d *driver) counters() string {
	return fmt.Sprintf("waiting=%d running=%d inflight=%d idle=%t", d.s.Waiting(), d.s.Running(), d.s.InFlight(), d.s.Idle())
}

func (d *driver) callsSince(before struct{ lookup, reserve, release int }) string {
	c := d.f.calls
	return fmt.Sprintf("calls: lookup=%d reserve=%d release=%d", c.lookup-before.lookup, c.reserve-before.reserve, c.release-before.release)
}

func (d *driver) compact(st Step) string {
	var parts []string
	for _, it := range st.Items {
		var s string
		if it.Prefill {
			s = fmt.Sprintf("p%d@%d+%d", it.ID, it.Pos, it.Tokens)
			if it.Reuse > 0 {
				s += fmt.Sprintf("r%d", it.Reuse)
			}
		} else {
			s = fmt.Sprintf("g%d@%d+1d%d", it.ID, it.Pos, it.Draft)
		}
		if it.Sample {
			s += "*"
		}
		parts = append(parts, s)
	}
	line := fmt.Sprintf("%d: %s", d.steps, strings.Join(parts, " "))
	if len(parts) == 0 {
		line += "-"
	}
	if len(st.Preempted) > 0 {
		line += fmt.Sprintf(" | preempted %v", st.Preempted)
	}
	for _, r := range st.Rejected {
		line += fmt.Sprintf(" | rejected %d: %s", r.ID, r.Reason)
	}
	return line + fmt.Sprintf(" | %d/%d\n", d.f.used, d.f.total)
}
