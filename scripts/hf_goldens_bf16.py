#!/usr/bin/env python3
"""bf16 goldens: transformers' greedy outputs of the committed golden
checkpoints (device/hf/testdata, float32 files) run in bfloat16, the oracle of
kvx's fast numerics (dtype bfloat16) by vLLM's rule.

For every family directory under TESTDATA (and TESTDATA/extra) that has
config.json, model.safetensors, prompts.jsonl and expected.json: load it with
transformers (dtype bfloat16, attn_implementation eager, on the GPU), run every
prompt of prompts.jsonl greedily as scripts/hf_goldens.py does (same
generation config, raw logits, top 5 log-softmax in float64 of the bf16
logits), and write OUT/<family>/expected-bf16.json in expected.json's shape,
plus OUT/versions-bf16.json.

Usage (on the GPU machine):
    python3 scripts/hf_goldens_bf16.py --testdata device/hf/testdata --out /tmp/bf16
"""

import argparse
import json
import os
import platform
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_goldens import greedy_generate, top_logprobs  # noqa: E402


def family_dirs(root):
    for base in (root, os.path.join(root, "extra")):
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            d = os.path.join(base, name)
            if all(os.path.isfile(os.path.join(d, f)) for f in ("config.json", "model.safetensors", "prompts.jsonl", "expected.json")):
                yield name, d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testdata", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default="", help="comma-separated names; all by default")
    a = ap.parse_args()
    import transformers
    from transformers import AutoModelForCausalLM
    dev = "cuda"
    want = set(filter(None, a.families.split(",")))
    done = {}
    for name, d in family_dirs(a.testdata):
        if want and name not in want:
            continue
        model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.bfloat16).to(dev).eval()
        rows = []
        for line in open(os.path.join(d, "prompts.jsonl")):
            line = line.strip()
            if not line:
                continue
            p = json.loads(line)
            seq, logits = greedy_generate(model, p["prompt_ids"], p["max_tokens"], dev)
            rows.append({"output_ids": seq, "top_logprobs": top_logprobs(logits)})
        os.makedirs(os.path.join(a.out, name), exist_ok=True)
        with open(os.path.join(a.out, name, "expected-bf16.json"), "w") as f:
            json.dump(rows, f)
        exp = json.load(open(os.path.join(d, "expected.json")))
        same = sum(1 for r, e in zip(rows, exp) if r["output_ids"] == e["output_ids"])
        done[name] = {"prompts": len(rows), "token_exact_vs_float32": same}
        print(f"{name}: {len(rows)} prompts; {same} give transformers' float32 tokens in bfloat16", flush=True)
        del model
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "versions-bf16.json"), "w") as f:
        json.dump({"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
                   "gpu": torch.cuda.get_device_name(0), "dtype": "bfloat16", "attn_implementation": "eager",
                   "families": done}, f, indent=1)


if __name__ == "__main__":
    main()
