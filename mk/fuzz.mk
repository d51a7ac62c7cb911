# mk/fuzz.mk: the native Go fuzz targets (issue 24, hostile input).
#
# Included by the top-level Makefile; paths are relative to the repository root.
#
#   make fuzz                 fuzz every target for FUZZTIME (default 10s)
#   make fuzz FUZZTIME=60s    longer; FUZZTIME takes go's forms (30s, 1000x)
#
# A short duration can fail a healthy target with "context deadline
# exceeded" (go test's fuzzing stops while an input runs); a count (5000x,
# as .ci/run uses) cannot.
#
# A target is any `func FuzzXxx(f *testing.F)` in a _test.go file of the
# root module, found with grep, so a new one is fuzzed without editing this
# file. go test fuzzes one target per invocation, so each gets its own run;
# the target fails when any run fails, after running them all. What a run
# finds is written to testdata/fuzz/FuzzXxx/ beside the target: keep it
# as a committed corpus entry once fixed. The seed corpora also run in
# every plain `go test` (make test); this target is not part of it.

FUZZTIME ?= 10s

.PHONY: fuzz

## fuzz: run every Fuzz target in the repo for FUZZTIME each (default 10s), one go test per target; fails if any fails
fuzz:
	@failed=""; \
	for file in $$(grep -rlE --include='*_test.go' --exclude-dir=.git --exclude-dir=examples --exclude-dir=bin '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' .); do \
	  dir=$$(dirname $$file); \
	  for name in $$(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(f \*testing\.F\).*/\1/p' $$file); do \
	    echo "fuzz: $$name in $$dir for $(FUZZTIME)"; \
	    $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$dir/ || failed="$$failed $$dir:$$name"; \
	  done; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: failed:$$failed" >&2; exit 1; fi; \
	echo "fuzz: every target passed"
