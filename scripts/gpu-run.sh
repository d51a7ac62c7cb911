#!/usr/bin/env bash
# run.sh (written into .gpu/ by `make gpu-bundle` from scripts/gpu-run.sh):
# runs the cuda device's checks on a machine with an NVIDIA GPU, where Go
# need not be installed:
#
#   bash .gpu/run.sh                 # STEPS="test compare fastcompare invariance"
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
#   compare  kvx compare (dtype float32, the exact numerics) of the cpu scenarios (the compares list below: GQA,
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
#            device cuda, dtype float32 (scripts/goldens.sh): tokens equal
#            transformers'
#   fastcompare  the compares on device cuda, dtype bfloat16 (the fast
#            numerics), plus chunk sizes and batch sizes: one digest each
#   goldensfast  the goldens with dtype bfloat16, by vLLM's top-5 rule
#   sampled  each golden's prompts sampled with a seed: the same tokens on
#            cpu and cuda (float32), alone and batched (bfloat16)
#   invariance  each golden prompt alone and in mixed batches, dtype
#            bfloat16: the same tokens and top-5 logprobs, bit for bit
#   wgmma    scripts/wgmma-probe.cu and scripts/kperm-probe.cu compiled
#            here (nvcc for sm_90a) and run: whether wgmma and mma.sync give
#            the same bits, and whether a k16 step's bits depend on the
#            order of its 16 k values
#   bf16goldens  transformers' bf16 outputs of the goldens into $OUT/bf16
#   e2e      a full-size Llama-3-8B checkpoint against transformers
#            (scripts/e2e.py): $OUT/e2e/e2e.md
#   tokenizers  scripts/hf_tokenizer_goldens.py into $OUT/tokenizers
#   mtp      the DeepSeek goldens with two MTP layers (hf/mtp, written by
#            make gpu-bundle: random, and quiet ones whose drafts are mostly
#            accepted) through kvx generate on device cuda, dtype float32
#            and bfloat16: the tokens with two drafts a step equal those
#            without, and float32 equals the cpu's; prints the acceptance
#   faults   a cuda worker that dies mid-run is replaced and its requests
#            recomputed: an injected illegal address and an injected
#            out-of-memory (CUDA_KVX_FAULT, once each) and a kill -9 from
#            outside, each run giving the clean run's outputs digest with
#            every request completed and a restart counted; and pools larger
#            than the GPU's free memory refused before anything is allocated
#            (TestOpenPoolsAboveFree)
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
STEPS=${STEPS:-test compare fastcompare invariance}
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
			timeout "${COMPARE_TIMEOUT:-180}" bin/kvx compare -c "scenarios/$scen" --set device=$dev --set dtype=float32 $args \
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

# fastcompare: the compares list on device cuda with the fast numerics
# (dtype bfloat16, cuda's default) plus chunk sizes: every variant of a
# scenario (managers, reuse, chunk sizes, two pipeline stages, the host
# tier) must give one outputs digest, as the exact numerics do; the fast
# kernels are deterministic and batch-invariant.
fastcompares=(
	"${compares[@]}"
	"cpu-llama.yaml --vary cache_manager=v1,v2 --vary max_num_tokens=32,48,200"
	# head dims the fast attention kernels take (64, 128; the goldens' are
	# smaller and run the exact kernel): prefill and split kernels, reuse
	"cpu-llama.yaml --vary cache_manager=v1,v2 --vary kv_cache_config.enable_block_reuse=true,false --set synthetic.head_dim=128 --set synthetic.hidden=256"
	"cpu-llama.yaml --vary cache_manager=v1,v2 --vary max_num_tokens=24,200 --vary max_batch_size=1,4 --set synthetic.head_dim=64 --set synthetic.hidden=256"
	"hf-llama.yaml --vary cache_manager=v1,v2 --vary max_num_tokens=16,64 --vary max_batch_size=1,4 --set model=$here/hf/testdata/llama"
)

step_fastcompare() {
	local rc=0 i=0 c
	for c in "${fastcompares[@]}"; do
		i=$((i + 1))
		local scen=${c%% *} args=${c#* }
		echo "== kvx compare -c $scen $args, device cuda, dtype bfloat16"
		# shellcheck disable=SC2086
		timeout "${COMPARE_TIMEOUT:-180}" bin/kvx compare -c "scenarios/$scen" --set device=cuda --set dtype=bfloat16 $args \
			--json "$OUT/fastcompare-$i.json" --no-progress || rc=1
		[[ -s $OUT/fastcompare-$i.json ]] || { echo "fastcompare $scen: no report"; rc=1; continue; }
		local d n
		d=$(digests "$OUT/fastcompare-$i.json") || { rc=1; continue; }
		echo "$d" | sed 's/^/  /'
		n=$(echo "$d" | awk '{print $NF}' | sort -u | wc -l)
		if [[ $n != 1 ]]; then
			echo "fastcompare $scen: the outputs digests differ: the fast numerics must be batch-invariant"
			rc=1
		else
			echo "fastcompare $scen: every variant has the same outputs digest"
		fi
	done
	return $rc
}

# goldensfast: the goldens with the fast numerics, by vLLM's top-5 rule.
step_goldensfast() {
	DTYPE=bfloat16 SCENARIO=scenarios/hf-llama.yaml bash scripts/goldens.sh cuda hf/testdata "$OUT/goldens-fast"
}

# cuda_goldens sets goldens to "dir name backend manager" for every golden
# checkpoint (with prompts) that the cuda device runs, with the attention
# backend and cache manager of its family (scripts/golden-family.sh);
# qwen3_next is skipped (no Gated DeltaNet kernel on cuda). It returns 1
# when a checkpoint has no model_type.
cuda_goldens() {
	goldens=()
	local dir name mt backend manager rc=0
	for dir in hf/testdata/*/ hf/testdata/extra/*/; do
		[[ -f $dir/prompts.jsonl && -f $dir/config.json ]] || continue
		name=$(basename "$dir")
		read -r mt backend manager < <(bash scripts/golden-family.sh "$dir") || { echo "$name: no model_type"; rc=1; continue; }
		[[ $mt == qwen3_next ]] && { echo "$name: skipped (no Gated DeltaNet kernel on cuda)"; continue; }
		goldens+=("$dir $name $backend $manager")
	done
	return $rc
}

# invariance: every golden checkpoint's prompts through kvx generate on
# device cuda, fast numerics, each prompt alone (max_batch_size 1, whole
# prompts in one chunk) and all together in batches of up to 12 with
# chunks of up to 24 tokens and blocks of 8 beside other prompts' decodes: the tokens and the top
# logprobs must be the same bits.
step_invariance() {
	local rc=0 g dir name backend manager
	mkdir -p "$OUT/invariance"
	cuda_goldens || rc=1
	for g in "${goldens[@]}"; do
		read -r dir name backend manager <<<"$g"
		local a=$OUT/invariance/$name-alone.json b=$OUT/invariance/$name-batched.json
		bin/kvx generate -c scenarios/hf-llama.yaml --set model="$(cd "$dir" && pwd)" --set device=cuda --set dtype=bfloat16 \
			--set attention_backend=$backend --set cache_manager=$manager --set max_batch_size=1 --set max_num_tokens=128 \
			--prompts "$dir/prompts.jsonl" --top-logprobs 5 --json "$a" >"$OUT/invariance/$name-alone.log" 2>&1 || { echo "$name: alone failed"; tail -3 "$OUT/invariance/$name-alone.log"; rc=1; continue; }
		bin/kvx generate -c scenarios/hf-llama.yaml --set model="$(cd "$dir" && pwd)" --set device=cuda --set dtype=bfloat16 \
			--set attention_backend=$backend --set cache_manager=$manager --set max_batch_size=12 --set max_num_tokens=24 --set kv_cache_config.tokens_per_block=8 \
			--prompts "$dir/prompts.jsonl" --top-logprobs 5 --json "$b" >"$OUT/invariance/$name-batched.log" 2>&1 || { echo "$name: batched failed"; tail -3 "$OUT/invariance/$name-batched.log"; rc=1; continue; }
		python3 - "$a" "$b" "$name" <<'PY' || rc=1
import json, sys
a = {r["line"]: (r.get("output_ids"), r.get("top_logprobs")) for r in json.load(open(sys.argv[1]))}
b = {r["line"]: (r.get("output_ids"), r.get("top_logprobs")) for r in json.load(open(sys.argv[2]))}
same = sum(1 for k in a if a[k] == b.get(k))
print(f"{sys.argv[3]}: {same}/{len(a)} prompts give the same tokens and top-5 logprobs alone and batched")
sys.exit(0 if same == len(a) and len(a) > 0 else 1)
PY
	done
	return $rc
}

# sampled: every golden checkpoint's prompts sampled with a seed (temperature,
# top_p, top_k, min_p and the three penalties on every line) through kvx
# generate. A seeded request's tokens are drawn from its seed and positions
# only, so on each numerics they must not depend on the device, the
# manager or the batch: with dtype float32 the cpu (alone) and cuda (v1
# batched and chunked, the family's manager alone) give the same tokens;
# with dtype bfloat16 cuda gives the same tokens and top-5 logprobs alone
# (v1) and batched (the family's manager). Some line must differ from the
# greedy tokens (expected.json), or the sampling did not run.
step_sampled() {
	local rc=0 g dir name backend manager
	mkdir -p "$OUT/sampled"
	cuda_goldens || rc=1
	for g in "${goldens[@]}"; do
		read -r dir name backend manager <<<"$g"
		local o=$OUT/sampled/$name model
		model=$(cd "$dir" && pwd)
		python3 - "$dir/prompts.jsonl" "$o-prompts.jsonl" <<'PY' || { rc=1; continue; }
import json, sys
with open(sys.argv[2], "w") as f:
    for i, l in enumerate(x for x in open(sys.argv[1]) if x.strip()):
        p = json.loads(l)
        p.update(temperature=0.9, top_p=0.95, top_k=40, min_p=0.02, seed=1000 + i,
                 presence_penalty=0.3, frequency_penalty=0.2, repetition_penalty=1.1)
        f.write(json.dumps(p) + "\n")
PY
		local alone="--set max_batch_size=1 --set max_num_tokens=128"
		local batched="--set max_batch_size=12 --set max_num_tokens=24 --set kv_cache_config.tokens_per_block=8"
		local runs=(
			"f32-cpu-v1 cpu float32 v1 $alone"
			"f32-cuda-v1 cuda float32 v1 $batched"
			"f32-cuda-$manager cuda float32 $manager $alone"
			"bf16-cuda-v1 cuda bfloat16 v1 $alone"
			"bf16-cuda-$manager cuda bfloat16 $manager $batched"
		)
		local r ok=1
		for r in "${runs[@]}"; do
			read -r tag dev dtype mgr sets <<<"$r"
			# shellcheck disable=SC2086
			bin/kvx generate -c scenarios/hf-llama.yaml --set model="$model" --set device=$dev --set dtype=$dtype \
				--set attention_backend=$backend --set cache_manager=$mgr $sets \
				--prompts "$o-prompts.jsonl" --top-logprobs 5 --json "$o-$tag.json" >"$o-$tag.log" 2>&1 ||
				{ echo "$name $tag: failed"; tail -3 "$o-$tag.log"; ok=0; }
		done
		((ok)) || { rc=1; continue; }
		python3 - "$name" "$dir/expected.json" "$o-f32-cpu-v1.json" "$o-f32-cuda-v1.json" "$o-f32-cuda-$manager.json" \
			"$o-bf16-cuda-v1.json" "$o-bf16-cuda-$manager.json" <<'PY' || rc=1
import json, sys
name, expected, f32, bf16 = sys.argv[1], sys.argv[2], sys.argv[3:6], sys.argv[6:8]
def load(p, logprobs):
    return {r["line"]: (r["output_ids"], r.get("top_logprobs") if logprobs else None) for r in json.load(open(p))}
ok = True
for label, files, lp in (("float32, cpu and cuda", f32, False), ("bfloat16, cuda alone and batched", bf16, True)):
    runs = [load(p, lp) for p in files]
    same = sum(1 for k in runs[0] if all(r.get(k) == runs[0][k] for r in runs[1:]))
    print(f"{name}: {label}: {same}/{len(runs[0])} sampled prompts give the same tokens{' and top-5 logprobs' if lp else ''}")
    ok = ok and same == len(runs[0]) > 0
greedy = [r["output_ids"] for r in json.load(open(expected))]
cpu = load(f32[0], False)
differ = sum(1 for i, g in enumerate(greedy) if cpu.get(i + 1, (None,))[0] != g)
print(f"{name}: {differ}/{len(greedy)} sampled prompts differ from the greedy tokens")
sys.exit(0 if ok and differ > 0 else 1)
PY
	done
	return $rc
}

# e2e: kvx's cuda device on a full-size random-weight Llama-3-8B checkpoint
# that transformers makes here (E2E_CKPT, reused when there), against
# transformers eager bf16 (sdpa) on the same prompts (scripts/e2e.py):
# decode steps at batch 1, 8 and 64, load, prefill, throughput; the table
# in $OUT/e2e.md. E2E_ARGS adds scripts/e2e.py flags (--skip-hf, --only).
step_e2e() {
	# shellcheck disable=SC2086
	python3 scripts/e2e.py --kvx bin/kvx --scenario scenarios/e2e-llama8b.yaml --out "$OUT/e2e" \
		--ckpt "${E2E_CKPT:-/tmp/kvx-e2e/llama8b}" ${E2E_ARGS:-}
}

# mtp: every checkpoint of hf/mtp through kvx generate on cuda without
# drafts and with two MTP drafts a step (dtype float32 and bfloat16), and
# on cpu without drafts: the tokens must be the same with drafts as
# without, and cuda float32's the cpu's.
step_mtp() {
	local rc=0 dir name mt backend manager dt
	mkdir -p "$OUT/mtp"
	for dir in hf/mtp/*/; do
		name=$(basename "$dir")
		read -r mt backend manager < <(bash scripts/golden-family.sh "$dir") || { echo "$name: no model_type"; rc=1; continue; }
		local gen=(bin/kvx generate -c scenarios/hf-llama.yaml --set model="$(cd "$dir" && pwd)" --set attention_backend=$backend
			--set cache_manager=$manager --prompts "$dir/prompts.jsonl")
		local drafts=(--set speculative_config.decoding_type=MTP --set speculative_config.max_draft_len=2)
		"${gen[@]}" --set device=cpu --json "$OUT/mtp/$name-cpu.json" >"$OUT/mtp/$name-cpu.log" 2>&1 || { echo "$name: cpu failed"; tail -3 "$OUT/mtp/$name-cpu.log"; rc=1; continue; }
		for dt in float32 bfloat16; do
			"${gen[@]}" --set device=cuda --set dtype=$dt --json "$OUT/mtp/$name-$dt.json" >"$OUT/mtp/$name-$dt.log" 2>&1 || { echo "$name $dt: failed"; tail -3 "$OUT/mtp/$name-$dt.log"; rc=1; continue; }
			"${gen[@]}" --set device=cuda --set dtype=$dt "${drafts[@]}" --json "$OUT/mtp/$name-$dt-mtp.json" >"$OUT/mtp/$name-$dt-mtp.log" 2>&1 || { echo "$name $dt mtp: failed"; tail -3 "$OUT/mtp/$name-$dt-mtp.log"; rc=1; continue; }
			python3 - "$OUT/mtp/$name-$dt.json" "$OUT/mtp/$name-$dt-mtp.json" "$OUT/mtp/$name-cpu.json" "$name $dt" "$(grep -o 'MTP drafts accepted [0-9]* of [0-9]*' "$OUT/mtp/$name-$dt-mtp.log")" <<'PY' || rc=1
import json, sys
ids = lambda f: {r["line"]: r.get("output_ids") for r in json.load(open(f))}
a, b, c = ids(sys.argv[1]), ids(sys.argv[2]), ids(sys.argv[3])
same = sum(1 for k in a if a[k] == b.get(k))
ok = same == len(a) > 0 and sys.argv[5] != ""
msg = f"{sys.argv[4]}: {same}/{len(a)} prompts give the same tokens with two MTP drafts a step as without ({sys.argv[5] or 'no drafts reported'})"
if sys.argv[4].endswith("float32"):
    cpu = sum(1 for k in a if a[k] == c.get(k))
    ok = ok and cpu == len(a)
    msg += f"; {cpu}/{len(a)} equal the cpu's"
print(msg)
sys.exit(0 if ok else 1)
PY
		done
	done
	return $rc
}

# faults: GPU faults survived (see the header). Each faulted run must give
# the clean run's digest, all requests completed and at least one plugin
# restart.
step_faults() {
	local rc=0 f pid
	mkdir -p "$OUT/faults"
	local run=(bin/kvx run -c scenarios/hf-llama.yaml --set model="$here/hf/testdata/llama" --set device=cuda --set isolation=plugin
		--set workload.requests=${FAULTS_REQUESTS:-1500} --no-progress)
	"${run[@]}" --json "$OUT/faults/clean.json" >"$OUT/faults/clean.log" 2>&1 || { echo "faults: the clean run failed"; tail -5 "$OUT/faults/clean.log"; return 1; }
	check_fault() {
		python3 - "$OUT/faults/clean.json" "$OUT/faults/$1.json" "$1" <<'PY'
import json, sys
c, f = (json.load(open(p))["variants"][0] for p in sys.argv[1:3])
rq, eng = f["requests"], f["engine"]
same = c["outputs"]["digest"] == f["outputs"]["digest"]
ok = same and rq["completed"] == rq["total"] == c["requests"]["total"] and eng["plugin_restarts"] >= 1
digest = "the clean run's" if same else "not the clean run's " + c["outputs"]["digest"]
print(f"faults {sys.argv[3]}: {rq['completed']}/{rq['total']} completed, {eng['plugin_restarts']} plugin restarts, "
      f"digest {f['outputs']['digest']} ({digest}), wall {eng['wall_s']:.1f} s against {c['engine']['wall_s']:.1f} s clean")
sys.exit(0 if ok else 1)
PY
	}
	for f in illegal oom; do
		rm -f "/tmp/kvx-fault-$f"
		CUDA_KVX_FAULT=$f:40:/tmp/kvx-fault-$f "${run[@]}" --json "$OUT/faults/$f.json" >"$OUT/faults/$f.log" 2>&1 || { echo "faults $f: kvx run exit $?"; tail -5 "$OUT/faults/$f.log"; rc=1; continue; }
		grep -m1 "the CUDA context is lost" "$OUT/faults/$f.log" | sed 's/^/  /'
		check_fault "$f" || rc=1
	done
	"${run[@]}" --json "$OUT/faults/kill.json" >"$OUT/faults/kill.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do pgrep -f kvx-backend-gqa >/dev/null && break; sleep 0.1; done
	sleep 1.5
	pkill -9 -f kvx-backend-gqa && echo "faults kill: kill -9 of the cuda worker 1.5 s after it started"
	if wait "$pid"; then check_fault kill || rc=1; else echo "faults kill: kvx run exit $?"; tail -5 "$OUT/faults/kill.log"; rc=1; fi
	# Pools larger than the GPU's free memory: refused before anything is
	# allocated (kvx sizes the pools within free_gpu_memory_fraction of the
	# free memory NVML reports, so a config cannot ask for more; the test
	# gives allocPools such a layout).
	(cd test && ./cuda.test -test.run '^TestOpenPoolsAboveFree$' -test.v -test.count=1) >"$OUT/faults/toobig.log" 2>&1 &&
		echo "faults toobig: TestOpenPoolsAboveFree passed" || { echo "faults toobig: TestOpenPoolsAboveFree failed"; tail -5 "$OUT/faults/toobig.log"; rc=1; }
	return $rc
}

# bf16goldens: transformers' outputs of the golden checkpoints in bfloat16
# (scripts/hf_goldens_bf16.py), the oracle of the fast numerics; copy
# $OUT/bf16/<family>/expected-bf16.json into device/hf/testdata to commit.
step_bf16goldens() {
	python3 scripts/hf_goldens_bf16.py --testdata hf/testdata --out "$OUT/bf16"
}

# serve: kvx serve of the llama golden checkpoint on device cuda; every
# golden prompt (token ids) through POST /v1/completions
# must give transformers' tokens (expected.json); then SIGTERM
# must drain and exit 0.
step_serve() {
	local port=${SERVE_PORT:-18431} rc=0
	bin/kvx serve -c scenarios/hf-llama.yaml --set model="$here/hf/testdata/llama" --set device="${SERVE_DEVICE:-cuda}" --set dtype=float32 \
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

# wgmma: does Hopper's wgmma give mma.sync's bits (scripts/wgmma-probe.cu)?
step_wgmma() {
	nvcc -gencode arch=compute_90a,code=sm_90a -O2 -o "$OUT/wgmma-probe" scripts/wgmma-probe.cu && "$OUT/wgmma-probe" &&
		nvcc -gencode arch=compute_90a,code=sm_90a -O2 -o "$OUT/kperm-probe" scripts/kperm-probe.cu && "$OUT/kperm-probe" 12 && "$OUT/kperm-probe" 40
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
		echo "run.sh: unknown step $step (known: test compare fastcompare goldens goldensfast invariance sampled bf16goldens e2e bench tokenizers calibrate serve)" | tee -a "$OUT/summary.txt"
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
