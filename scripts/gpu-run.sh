#!/usr/bin/env bash
# run.sh (written into .gpu/ by `make gpu-bundle` from scripts/gpu-run.sh):
# runs the cuda device's checks on a machine with an NVIDIA GPU, where Go
# need not be installed:
#
#   bash .gpu/run.sh                 # STEPS="test compare"
#   STEPS="test" TEST_ARGS="-test.run TestOps" bash .gpu/run.sh
#
# The bundle beside it (bundle.tar.xz, unpacked here on the first run) holds
#   bin/        kvx, the managers, and the backends built with -tags cuda;
#               kvx finds its plugins in its own directory, so bin/kvx runs
#               them from bin/ (PATH gets bin/ too)
#   test/       cuda.test, `go test -c -tags cuda ./device/cuda`; it runs in
#               test/, so the tests reach device/hf/testdata as
#               ../hf/testdata (from device/cuda in the repo, the same
#               relative path)
#   hf/testdata the Hugging Face goldens (device/hf/testdata)
#   scenarios/  the repo's scenarios
#   bench/      the repo's bench/ (not packed), if it had one
#
# Steps (STEPS, space-separated, in order):
#   test     ./cuda.test -test.v -test.count=1 $TEST_ARGS, from test/
#   compare  kvx compare of scenarios/cpu-llama.yaml, cache managers v1 and
#            v2, once with device cuda and once with device cpu; prints the
#            outputs digest of every variant and fails unless all are equal
#   bench    python3 bench/baselines.py if present, then every bench/*.sh
# Each step's output goes to the terminal and to $OUT/<step>.log, and its
# exit status to $OUT/summary.txt ($OUT defaults to ./out beside run.sh).
# The exit status is 0 only when every step passed.
set -u
cd "$(dirname "$0")" || exit 1
here=$PWD
export PATH=$here/bin:$PATH
OUT=${OUT:-$here/out}
mkdir -p "$OUT"
STEPS=${STEPS:-test compare}
TEST_ARGS=${TEST_ARGS:-}

if [[ -f bundle.tar.xz ]]; then
	echo "run.sh: unpacking bundle.tar.xz"
	if command -v xz >/dev/null; then
		tar -xJf bundle.tar.xz || exit 1
	else
		python3 -c 'import tarfile, sys; tarfile.open(sys.argv[1]).extractall(".")' bundle.tar.xz || exit 1
	fi
fi
if [[ ! -x bin/kvx ]]; then
	echo "run.sh: no bin/kvx in $here; build the bundle with make gpu-bundle" >&2
	exit 1
fi

{
	echo "# run.sh $(date -u +%FT%TZ) on $(hostname)"
	if command -v nvidia-smi >/dev/null; then nvidia-smi -L 2>&1; else echo "nvidia-smi: not found"; fi
} | tee "$OUT/summary.txt"

# digests FILE prints "variant digest" for every variant of a kvx compare
# --json report.
digests() {
	python3 - "$1" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r.get("variant", "?"), (r.get("outputs") or {}).get("digest", "-"))
EOF
}

step_test() {
	(cd test && ./cuda.test -test.v -test.count=1 $TEST_ARGS)
}

step_compare() {
	local dev rc=0
	for dev in cuda cpu; do
		echo "== kvx compare, device $dev"
		bin/kvx compare -c scenarios/cpu-llama.yaml --set device=$dev --vary cache_manager=v1,v2 \
			--json "$OUT/compare-$dev.json" --no-progress || rc=1
	done
	[[ -s $OUT/compare-cuda.json && -s $OUT/compare-cpu.json ]] || { echo "compare: a run wrote no report"; return 1; }
	echo "== outputs digest"
	local cuda cpu
	cuda=$(digests "$OUT/compare-cuda.json") || return 1
	cpu=$(digests "$OUT/compare-cpu.json") || return 1
	echo "device cuda:"; echo "$cuda" | sed 's/^/  /'
	echo "device cpu:"; echo "$cpu" | sed 's/^/  /'
	local n
	n=$(printf '%s\n%s\n' "$cuda" "$cpu" | awk '{print $NF}' | sort -u | wc -l)
	if [[ $n != 1 ]]; then
		echo "compare: the outputs digests differ: device cuda must give device cpu's tokens bit for bit"
		return 1
	fi
	echo "compare: every variant on both devices has the same outputs digest"
	return $rc
}

step_bench() {
	local ran=0 rc=0 s
	if [[ -f bench/baselines.py ]]; then
		ran=1
		python3 bench/baselines.py || rc=1
	fi
	for s in bench/*.sh; do
		[[ -f $s ]] || continue
		ran=1
		echo "== $s"
		bash "$s" || rc=1
	done
	[[ $ran == 1 ]] || echo "bench: nothing to run (no bench/baselines.py, no bench/*.sh)"
	return $rc
}

failed=0
for step in $STEPS; do
	if ! declare -F "step_$step" >/dev/null; then
		echo "run.sh: unknown step $step (known: test compare bench)" | tee -a "$OUT/summary.txt"
		failed=1
		continue
	fi
	echo "== step $step"
	set -o pipefail
	"step_$step" 2>&1 | tee "$OUT/$step.log"
	rc=$?
	set +o pipefail
	echo "$step $rc" | tee -a "$OUT/summary.txt"
	[[ $rc == 0 ]] || failed=1
done
exit $failed
