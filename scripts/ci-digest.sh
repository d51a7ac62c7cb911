#!/usr/bin/env bash
# ci-digest.sh LOG: what failed in a make test log, printed last, since the
# last lines of a CI run may be all its reader sees: the FAIL lines, panics,
# fatal errors and make's own failures; for a test binary that timed out,
# the tests it found running and the stacks of the goroutines that run a
# test (a _test.go frame or testing.tRunner), each cut to its first lines.
set -euo pipefail
log=$1
echo "==== ci digest: what failed (the whole log is above) ===="
grep -n -E '^(--- FAIL|FAIL|panic:|fatal error:|make(\[[0-9]+\])?: \*\*\*)' "$log" | head -60 || true
if grep -q '^panic: test timed out' "$log"; then
  echo "---- tests running at the timeout:"
  awk '/^\trunning tests:/ { on = 1; next } on && /^\t\t/ { print; if (++k == 24) exit; next } { on = 0 }' "$log"
  echo "---- goroutines of running tests (at most 12, 24 lines each):"
  awk '
    function flush() { if (blk != "" && tst && shown < 12) { printf "%s\n", blk; shown++ } blk = ""; n = 0; tst = 0; in_blk = 0 }
    /^goroutine [0-9]+ \[/ { flush(); in_blk = 1 }
    in_blk && /^$/ { flush(); next }
    in_blk && n == 1 && /^testing\.\(\*T\)\.Run\(/ { in_blk = 0; blk = ""; next }
    in_blk { if (n < 24) blk = blk $0 "\n"; n++; if ($0 ~ /_test\.go:|testing\.tRunner/) tst = 1 }
    END { flush() }
  ' "$log"
fi
