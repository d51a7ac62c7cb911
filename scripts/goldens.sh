#!/usr/bin/env bash
# goldens.sh DEVICE TESTDATA OUTDIR: runs every transformers golden checkpoint
# of TESTDATA (device/hf/testdata: config.json, model.safetensors,
# prompts.jsonl, expected.json) through `kvx generate` on DEVICE and checks
# that every prompt's greedy tokens are transformers' exactly. kvx must be on
# PATH; the scenario is scenarios/hf-llama.yaml beside TESTDATA's parent or
# given as SCENARIO. Exit status 0 only when every checkpoint matched.
set -u
dev=$1 td=$2 out=$3
scen=${SCENARIO:-scenarios/hf-llama.yaml}
mkdir -p "$out"
rc=0
for dir in "$td"/*/ "$td"/extra/*/; do
	[[ -f $dir/expected.json && -f $dir/config.json ]] || continue
	name=$(basename "$dir")
	backend=gqa manager=v2
	mt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("model_type",""))' "$dir/config.json")
	case $mt in
	deepseek_v3) backend=mla ;;
	deepseek_v32) backend=dsa ;;
	nemotron_h | qwen3_next) manager=mamba ;;
	esac
	# The cuda device has no Gated DeltaNet kernel and refuses Qwen3-Next at
	# Open (device/cuda TestOpenRefusesGDN); say so instead of failing.
	if [[ $dev == cuda && $mt == qwen3_next ]]; then
		echo "$name: skipped on device cuda (no Gated DeltaNet kernel; the device refuses the architecture)"
		continue
	fi
	if ! timeout "${GOLDEN_TIMEOUT:-120}" kvx generate -c "$scen" --set model="$(cd "$dir" && pwd)" --set device="$dev" \
		--set attention_backend=$backend --set cache_manager=$manager --prompts "$dir/prompts.jsonl" \
		--json "$out/$name.json" >"$out/$name.log" 2>&1; then
		echo "$name: kvx generate failed:"; tail -3 "$out/$name.log"; rc=1; continue
	fi
	python3 - "$dir/expected.json" "$out/$name.json" "$name" "$dev" <<'PY' || rc=1
import json, sys
want = json.load(open(sys.argv[1]))
got = {r["line"]: r["output_ids"] for r in json.load(open(sys.argv[2]))}
same = sum(1 for i, w in enumerate(want) if got.get(i + 1) == w["output_ids"])
print(f"{sys.argv[3]}: {same}/{len(want)} prompts token-exact against transformers on device {sys.argv[4]}")
sys.exit(0 if same == len(want) else 1)
PY
done
exit $rc
