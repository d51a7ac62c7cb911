#!/usr/bin/env python3
"""Extra goldens for the Llama family's options that the main set
(scripts/hf_goldens.py) does not exercise, built with that script's own
functions (same seeds scheme, tie screening, reload-from-file, cpu
expected.json):

    llama_yarn   LlamaForCausalLM, rope_type yarn (factor 4, original max
                 positions 32, attention factor from mscale), attention_bias
                 and mlp_bias on
    qwen3_swa    Qwen3ForCausalLM with use_sliding_window (window 16 on
                 layers >= max_window_layers 1, full attention on layer 0)
                 and attention_bias on

Linear biases get 0.1*N(0,1) (randomize_with_biases). The committed files
were made on 2026-12-01 on one H200 with torch 2.11 and transformers 5.17.0
(extra_report.json).
transformers warns that llama_yarn's factor 4 differs from
max_position_embeddings / original_max_position_embeddings (8) and uses the
explicit factor, as kvx does.

Usage, from the repository root on the machine with torch + transformers 5:
    python3 device/hf/testdata/extra/make.py --out OUT
writes OUT/<family>/{config.json,model.safetensors,prompts.jsonl,expected.json}
and OUT/extra_report.json.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "scripts"))
import hf_goldens as g  # noqa: E402
import torch  # noqa: E402


def randomize_with_biases(model, seed):
    """hf_goldens.randomize_small_params, plus 0.1*N(0,1) on every linear
    bias (from_config leaves them 0, so a kernel that skipped them would
    pass)."""
    touched = _randomize(model, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point() and t.dim() == 1 and name.endswith("_proj.bias"):
                t.add_(0.1 * torch.randn(t.shape, generator=gen).to(t.dtype))
                touched.append(name)
    return touched


_randomize = g.randomize_small_params
g.randomize_small_params = randomize_with_biases


def families():
    common = dict(vocab_size=g.VOCAB, initializer_range=g.INIT_RANGE, max_position_embeddings=256,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True)
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}
    return {
        "llama_yarn": ("llama", dict(common, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                                     hidden_act="silu", tie_word_embeddings=False, attention_bias=True,
                                     mlp_bias=True, rope_parameters=yarn)),
        "qwen3_swa": ("qwen3", dict(common, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                                    hidden_act="silu", tie_word_embeddings=False, attention_bias=True,
                                    use_sliding_window=True, sliding_window=16, max_window_layers=1,
                                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(g.SEED)
    os.makedirs(a.out, exist_ok=True)
    import transformers
    report = {"transformers": transformers.__version__, "torch": torch.__version__, "families": {}}
    for i, (name, (mt, kw)) in enumerate(families().items()):
        g.log(f"== {name} ({mt})")
        rep = g.build_family(name, mt, kw, a.out, g.SEED + 5000 + 100 * i)
        rep.pop("candidates_detail", None)
        report["families"][name] = rep
        g.log(f"  kept {rep['kept']}/{rep['candidates']}, max |dlogprob| cpu/gpu {rep['kept_max_abs_logprob_diff_cpu_gpu']}")
    with open(os.path.join(a.out, "extra_report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
