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
#   scripts/    the Python scripts the bench and tokenizers steps run
#
# Steps (STEPS, space-separated, in order):
#   test     ./cuda.test -test.v -test.count=1 $TEST_ARGS, from test/
#   compare  kvx compare of the cpu scenarios (the compares list below: GQA,
#            DSA and dense MLA, the hybrid, a checkpoint; managers v1, v2 and
#            mamba, reuse on and off, the host tier for reuse and suspend,
#            mamba's snapshots on the host tier, two pipeline stages), once
#            with device cuda and once with device cpu; prints the outputs
#            digest of every variant and fails unless all of a scenario's
#            are equal
#   bench    the kernels' Go benchmarks (copy, GQA decode, MLA decode, DSA
#            against dense MLA, the bf16 tensor-core GEMM, the exact matmul),
#            then scripts/cuda-bench.py: PyTorch baselines in the same run and
#            $OUT/cuda-bench.{md,json}
#   goldens  every transformers golden checkpoint through kvx generate on
#            device cuda (scripts/goldens.sh): tokens equal transformers'
#   tokenizers  scripts/hf_tokenizer_goldens.py into $OUT/tokenizers
#   serve    kvx serve of the llama golden on device cuda, its prompts
#            through /v1/completions (transformers' tokens), then SIGTERM
#   calibrate  kvx calibrate on device cuda at real model shapes
#            (scenarios/calib-llama.yaml with 4 and 2 layers, calib-dsa.yaml
#            with dsa and with mla): $OUT/calib-<name>.json each, then every
#            point refitted into $OUT/calibration-h200.json (the candidate
#            for core/hw/calibrations/h200.json). CALIBRATE_BUDGET (20s)
#            bounds each config's measuring (no new context rung after it,
#            no new forward after twice it), CALIBRATE_TIMEOUT (120 s) its
#            whole run
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
# --json report (docs/report.schema.json: {"schema": "kvx.report/v1",
# "variants": [...]}); a variant that did not finish prints its status.
digests() {
	python3 - "$1" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
if not isinstance(doc, dict) or doc.get("schema") != "kvx.report/v1":
    sys.exit("%s: not a kvx.report/v1 document" % sys.argv[1])
for r in doc["variants"]:
    digest = (r.get("outputs") or {}).get("digest") or "-"
    if r.get("status", "finished") != "finished":
        digest = r["status"]
    print(r.get("variant", "?"), digest)
EOF
}

step_test() {
	(cd test && ./cuda.test -test.v -test.count=1 -test.timeout "${TEST_TIMEOUT:-120s}" $TEST_ARGS)
}

# The compares: scenario, then kvx's --vary and --set arguments. Every
# variant of a scenario must give the same outputs digest on both devices.
compares=(
	"cpu-llama.yaml --vary cache_manager=v1,v2 --vary kv_cache_config.enable_block_reuse=true,false"
	"cpu-dsa.yaml --vary cache_manager=v1,v2"
	"cpu-dsa.yaml --vary cache_manager=v1,v2 --set attention_backend=mla"
	"cpu-hybrid.yaml --vary cache_manager=v1,mamba"
	"hf-llama.yaml --vary cache_manager=v1,v2 --set model=$here/hf/testdata/llama"
	# cpu-llama's host tier (1 MiB) already takes evicted blocks and
	# suspended sequences; these add two stages, mamba's snapshots through
	# the host tier (a tiny ssm pool), and mamba's suspended live states.
	"cpu-llama.yaml --vary cache_manager=v1,v2 --set pipeline_parallel_size=2"
	"cpu-hybrid.yaml --vary cache_manager=v1,mamba --vary kv_cache_config.host_cache_size=0,33554432 --set kv_cache_config.pool_ratio=[0.9998,0.0002] --set workload.requests=24"
	"cpu-hybrid.yaml --vary cache_manager=v1,mamba --set kv_cache_config.max_tokens=640 --set kv_cache_config.host_cache_size=1048576 --set scheduler_config.capacity_scheduler_policy=MAX_UTILIZATION --set workload.concurrency=6 --set workload.requests=16 --set pipeline_parallel_size=2"
)

step_compare() {
	local dev rc=0 i=0 c
	for c in "${compares[@]}"; do
		i=$((i + 1))
		local scen=${c%% *} args=${c#* }
		for dev in cuda cpu; do
			echo "== kvx compare -c $scen $args, device $dev"
			# shellcheck disable=SC2086
			timeout "${COMPARE_TIMEOUT:-180}" bin/kvx compare -c "scenarios/$scen" --set device=$dev $args \
				--json "$OUT/compare-$i-$dev.json" --no-progress || rc=1
		done
		[[ -s $OUT/compare-$i-cuda.json && -s $OUT/compare-$i-cpu.json ]] || { echo "compare $scen: a run wrote no report"; rc=1; continue; }
		local cuda cpu n
		cuda=$(digests "$OUT/compare-$i-cuda.json") || { rc=1; continue; }
		cpu=$(digests "$OUT/compare-$i-cpu.json") || { rc=1; continue; }
		echo "device cuda:"; echo "$cuda" | sed 's/^/  /'
		echo "device cpu:"; echo "$cpu" | sed 's/^/  /'
		n=$(printf '%s\n%s\n' "$cuda" "$cpu" | awk '{print $NF}' | sort -u | wc -l)
		if [[ $n != 1 ]]; then
			echo "compare $scen: the outputs digests differ: device cuda must give device cpu's tokens bit for bit"
			rc=1
		else
			echo "compare $scen: every variant on both devices has the same outputs digest"
		fi
	done
	return $rc
}

# serve: kvx serve of the llama golden checkpoint on device cuda; every
# golden prompt (token ids) through POST /v1/completions
# must give transformers' tokens (expected.json); then SIGTERM
# must drain and exit 0.
step_serve() {
	local port=${SERVE_PORT:-18431} rc=0
	bin/kvx serve -c scenarios/hf-llama.yaml --set model="$here/hf/testdata/llama" --set device="${SERVE_DEVICE:-cuda}" \
		--port "$port" >"$OUT/serve-server.log" 2>&1 &
	local pid=$!
	python3 - "$port" "$here/hf/testdata/llama" <<'PY' || rc=1
import json, sys, time, urllib.request
port, td = sys.argv[1], sys.argv[2]
base = "http://127.0.0.1:%s" % port
for _ in range(600):
    try:
        if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
            break
    except Exception:
        time.sleep(0.1)
else:
    sys.exit("serve: /health never answered 200")
model = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
want = json.load(open(td + "/expected.json"))
prompts = [json.loads(l) for l in open(td + "/prompts.jsonl") if l.strip()]
same = 0
for i, (p, w) in enumerate(zip(prompts, want)):
    body = {"model": model, "prompt": p["prompt_ids"], "max_tokens": p["max_tokens"]}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    got = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["token_ids"]
    same += got == w["output_ids"]
print("serve: %d/%d golden prompts give transformers' tokens" % (same, len(want)))
sys.exit(0 if same == len(want) else 1)
PY
	kill -TERM "$pid"
	if wait "$pid"; then echo "serve: SIGTERM drained, exit 0"; else echo "serve: exit $? after SIGTERM"; rc=1; fi
	return $rc
}

# bench: the cuda kernels' benchmarks (the test binary's), then PyTorch's
# baselines on the same GPU and the table of ratios (scripts/cuda-bench.py).
step_bench() {
	(cd test && timeout "${BENCH_TIMEOUT:-300}" ./cuda.test -test.run '^$' -test.bench "${BENCH:-Copy|DecodeGQA|MLADecode|DSA|GEMM|MatMul}" -test.benchtime "${BENCHTIME:-10x}") | tee "$OUT/go-bench.txt"
	python3 scripts/cuda-bench.py --go-bench "$OUT/go-bench.txt" --out "$OUT"
}

# goldens: every transformers golden checkpoint (hf/testdata) through kvx
# generate on device cuda, each prompt's tokens transformers' exactly.
step_goldens() {
	SCENARIO=scenarios/hf-llama.yaml bash scripts/goldens.sh cuda hf/testdata "$OUT/goldens"
}

# tokenizers: Hugging Face tokenizers' encodings of small tokenizers built
# from scratch there (scripts/hf_tokenizer_goldens.py), the oracle of kvx's
# tokenizer.json reader.
step_tokenizers() {
	python3 scripts/hf_tokenizer_goldens.py "$OUT/tokenizers"
}

# calibrate: the sim's calibration from measured cuda forwards (kvx
# calibrate, docs/cuda.md): one file per config, then one fit over all.
# llama2 (2 layers instead of 4) tells the per-layer costs from the
# per-step ones when all the points are fitted together.
calibrates=(
	"llama calib-llama.yaml"
	"llama2 calib-llama.yaml --set synthetic.layers=2"
	"dsa calib-dsa.yaml"
	"mla calib-dsa.yaml --set attention_backend=mla"
)

step_calibrate() {
	local rc=0 c refit=()
	for c in "${calibrates[@]}"; do
		local name=${c%% *} rest=${c#* }
		local scen=${rest%% *} args=""
		[[ $rest == *" "* ]] && args=${rest#* }
		echo "== kvx calibrate -c $scen $args, device cuda"
		# shellcheck disable=SC2086
		timeout -k 20 "${CALIBRATE_TIMEOUT:-120}" bin/kvx calibrate -c "scenarios/$scen" --set device=cuda $args \
			--budget "${CALIBRATE_BUDGET:-20s}" --out "$OUT/calib-$name.json" || rc=1
		[[ -s $OUT/calib-$name.json ]] && refit+=(--refit "$OUT/calib-$name.json")
	done
	if ((${#refit[@]} > 0)); then
		echo "== kvx calibrate ${refit[*]}"
		bin/kvx calibrate "${refit[@]}" --out "$OUT/calibration-h200.json" || rc=1
	else
		rc=1
	fi
	return $rc
}

failed=0
for step in $STEPS; do
	if ! declare -F "step_$step" >/dev/null; then
		echo "run.sh: unknown step $step (known: test compare goldens bench tokenizers calibrate serve)" | tee -a "$OUT/summary.txt"
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
