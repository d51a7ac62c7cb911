#!/usr/bin/env bash
# goldens.sh DEVICE TESTDATA OUTDIR: runs every transformers golden checkpoint
# of TESTDATA (device/hf/testdata: config.json, model.safetensors,
# prompts.jsonl, expected.json) through `kvx generate` on DEVICE and checks
# every prompt's greedy tokens against transformers'. kvx must be on PATH;
# the scenario is scenarios/hf-llama.yaml beside TESTDATA's parent or given
# as SCENARIO. DTYPE (float32) is kvx's dtype:
#   float32   the exact numerics: every prompt's tokens transformers' exactly;
#   bfloat16  the fast numerics (cuda): vLLM's rule against transformers
#             run in bfloat16 (expected-bf16.json, scripts/hf_goldens_bf16.py;
#             expected.json where a family has none): the tokens are equal,
#             or at the first position where they differ each token is in
#             the other's top 5. The same against the float32 run is reported.
# Exit status 0 only when every checkpoint passed.
set -u
dev=$1 td=$2 out=$3
scen=${SCENARIO:-scenarios/hf-llama.yaml}
dtype=${DTYPE:-float32}
mkdir -p "$out"
rc=0
for dir in "$td"/*/ "$td"/extra/*/; do
	[[ -f $dir/expected.json && -f $dir/config.json ]] || continue
	name=$(basename "$dir")
	read -r mt backend manager < <(bash "$(dirname "$0")/golden-family.sh" "$dir") || { echo "$name: no model_type"; rc=1; continue; }
	# The cuda device has no Gated DeltaNet kernel and refuses Qwen3-Next at
	# Open (device/cuda TestOpenRefusesGDN); say so instead of failing.
	if [[ $dev == cuda && $mt == qwen3_next ]]; then
		echo "$name: skipped on device cuda (no Gated DeltaNet kernel; the device refuses the architecture)"
		continue
	fi
	if ! timeout "${GOLDEN_TIMEOUT:-120}" kvx generate -c "$scen" --set model="$(cd "$dir" && pwd)" --set device="$dev" \
		--set attention_backend=$backend --set cache_manager=$manager --set dtype="$dtype" --prompts "$dir/prompts.jsonl" \
		--top-logprobs 5 --json "$out/$name.json" >"$out/$name.log" 2>&1; then
		echo "$name: kvx generate failed:"; tail -3 "$out/$name.log"; rc=1; continue
	fi
	python3 - "$dir" "$out/$name.json" "$name" "$dev" "$dtype" <<'PY' || rc=1
import json, os, sys
d, name, dev, dtype = sys.argv[1], sys.argv[3], sys.argv[4], sys.argv[5]
got = {r["line"]: r for r in json.load(open(sys.argv[2]))}


def check(ref, rule):
    """(prompts, exact, within the rule, misses, largest logprob difference while the tokens agree)."""
    want = json.load(open(ref))
    exact = close = 0
    worst, misses = 0.0, []
    for i, w in enumerate(want):
        g = got.get(i + 1) or {}
        gi, wi = g.get("output_ids") or [], w["output_ids"]
        if gi == wi:
            exact += 1
        elif rule and len(gi) == len(wi):
            # vLLM's rule at the first difference.
            j = next(j for j in range(len(wi)) if gi[j] != wi[j])
            gtop = [t[0] for t in g["top_logprobs"][j]]
            wtop = [t[0] for t in w["top_logprobs"][j]]
            if wi[j] in gtop and gi[j] in wtop:
                close += 1
            else:
                misses.append(f"prompt {i + 1} token {j}: kvx {gi[j]} (top 5 {gtop}), transformers {wi[j]} (top 5 {wtop})")
        for j in range(len(wi)):
            if j >= len(gi) or gi[j] != wi[j]:
                break
            lw = dict((t[0], t[1]) for t in w["top_logprobs"][j])
            lg = dict((t[0], t[1]) for t in g.get("top_logprobs", [[]] * len(gi))[j])
            if wi[j] in lw and wi[j] in lg:
                worst = max(worst, abs(lw[wi[j]] - lg[wi[j]]))
    return len(want), exact, close, misses, worst


ok = True
if dtype == "float32":
    n, exact, _, _, worst = check(os.path.join(d, "expected.json"), False)
    print(f"{name}: {exact}/{n} prompts token-exact against transformers (float32) on device {dev}, dtype {dtype}; largest logprob difference {worst:.3g}")
    ok = exact == n
else:
    # The gate is transformers in bfloat16 (expected-bf16.json, from
    # scripts/hf_goldens_bf16.py) where it is there; float32 is reported.
    refs = [("bfloat16", "expected-bf16.json"), ("float32", "expected.json")]
    refs = [(t, os.path.join(d, f)) for t, f in refs if os.path.isfile(os.path.join(d, f))]
    for k, (tag, ref) in enumerate(refs):
        n, exact, close, misses, worst = check(ref, True)
        gate = k == 0
        print(f"{name}: against transformers {tag}{' (the gate)' if gate else ''}: {exact}/{n} token-exact, {close} more within the top-5 rule; "
              f"largest logprob difference while the tokens agree {worst:.3g} (device {dev}, dtype {dtype})")
        for m in misses:
            print("  " + m)
        if gate:
            ok = exact + close == n
sys.exit(0 if ok else 1)
PY
done
exit $rc
