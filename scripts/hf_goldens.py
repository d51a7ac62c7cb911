#!/usr/bin/env python3
"""Goldens made by transformers (issue 13, item 4).

Builds tiny random-weight float32 checkpoints, one directory per family, with
fixed seeds, and runs transformers' own greedy generation on them:

    OUT/<family>/config.json        as transformers 5 writes it (save_pretrained)
    OUT/<family>/model.safetensors  float32
    OUT/<family>/prompts.jsonl      {"prompt_ids": [...], "max_tokens": N} per line
    OUT/<family>/expected.json      [{"output_ids": [...], "top_logprobs": [[[id, lp] x5] per step]}]
    OUT/versions.json               python/torch/transformers/safetensors/GPU
    OUT/report.json                 per family: config summary, tensors, kept/dropped prompts, checks

Tie screening. Greedy choices of a random tiny model can sit on exact or near
ties (transformers' DeepSeek-V3.2 indexer applies a ReLU, so index scores tie
exactly and torch.topk breaks the tie differently on cpu and on the GPU). Each
candidate prompt is therefore generated three times:
    (a) on the GPU, (b) on the CPU, (c) on the GPU with every weight multiplied
    by 1 + 1e-6 * N(0, 1) (fixed seed),
and only prompts whose output ids are identical in all three are kept. A
shared-prefix pair is kept only if both its prompts pass. expected.json is
the unperturbed CPU run (the Go cpu device is its consumer). The run also
records, for information, whether a no-KV-cache CPU run (full recompute each
step) gives the same ids, and the smallest top-1/top-2 logit gap seen.

All generation is greedy over the raw logits (generation config with no
processors, no eos: eos_token_id is null in the configs, so every prompt runs
exactly max_tokens steps). top_logprobs are log_softmax of the raw float32
logits of the step, top 5, highest first.

fp8 (--fp8-block R,C; not run yet). Adds the family deepseek_v3_fp8: deepseek_v3's
config and seed, its model.safetensors rewritten as DeepSeek-V3 ships weights: every 2-D
*_proj weight in float8_e4m3fn with a float32 <name>_scale_inv of shape
[ceil(rows/R), ceil(cols/C)] (max|w|/448 per block), quantization_config
{quant_method fp8, fmt e4m3, weight_block_size [R, C]} in config.json. transformers'
runs use exactly the dequantized weights (fp8 x scale in float32, reloaded from a
float32 copy that is then deleted), which is what kvx's loader computes; transformers'
native fp8 GEMM (dynamic activation quantization) is not what the golden checks.

Usage (on the machine with torch + transformers 5):
    python3 scripts/hf_goldens.py --out /tmp/goldens [--families llama,qwen3] [--fp8-block 16,24]
"""

import argparse
import copy
import datetime
import json
import os
import platform
import random
import sys
import time
import traceback

import torch

SEED = 1234
VOCAB = 256
INIT_RANGE = 0.2       # std of the normal init: logits std ~ 0.2*sqrt(hidden), so greedy gaps are wide
NORM_NOISE = 0.1       # norm weights get w + 0.1*N(0,1) so a kernel that ignores them fails
PERTURB_REL = 1e-6     # relative weight perturbation of run (c)
NEAR_TIE = 1e-4        # a prompt whose cpu run has a top-1/top-2 logit gap below this is dropped
LOGPROB_TOL = 1e-3     # ... and so is one whose logprobs (any token, any step) differ by more than this
                       # between the cpu run and either GPU run: a hidden tie (e.g. a different DSA
                       # index selection) that happened not to change the greedy token
MAX_SINGLES = 8
MAX_PAIRS = 2


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------- families

def families():
    """name -> (model_type, config kwargs, extra setup). Every config is tiny and float32."""
    common = dict(vocab_size=VOCAB, initializer_range=INIT_RANGE, max_position_embeddings=256,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True)
    llama3_rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    yarn_rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    mla = dict(max_position_embeddings=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
               routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=16,
               qk_nope_head_dim=16, n_group=4, topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1,
               norm_topk_prob=True, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
               rope_parameters=dict(yarn_rope))
    nompe = {k: v for k, v in common.items() if k != "max_position_embeddings"}
    fams = {
        # GQA 4q/2kv, llama3 rope, untied
        "llama": ("llama", dict(common, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                                hidden_act="silu", tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                                rope_parameters=dict(llama3_rope))),
        # MHA, default rope, tied embeddings (no lm_head.weight in the file)
        "llama_tied": ("llama", dict(common, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=4, head_dim=16, rms_norm_eps=1e-6,
                                     hidden_act="silu", tie_word_embeddings=True, attention_bias=False,
                                     mlp_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        # MQA, sliding window 32 < longest prompt (100)
        "mistral": ("mistral", dict(common, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5,
                                    hidden_act="silu", tie_word_embeddings=False, sliding_window=32,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        # q/k norm, head_dim*heads (128) != hidden (64)
        "qwen3": ("qwen3", dict(common, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                                hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
                                use_sliding_window=False,
                                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        # MLA (q_lora, kv_lora, interleaved rope, yarn), grouped top-k MoE, shared expert, first layer dense
        "deepseek_v3": ("deepseek_v3", dict(nompe, rope_interleave=True, **mla)),
        # DSA: MLA + lightning indexer choosing 16 tokens
        "deepseek_v32": ("deepseek_v32", dict(nompe, index_topk=16, index_head_dim=16, index_n_heads=16,
                                              **mla)),
        # Mamba2 (M), attention (*), relu2 MLP (-)
        "nemotron_h": ("nemotron_h", dict(common, hidden_size=64, hybrid_override_pattern="M*-M-",
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                          intermediate_size=128, mlp_hidden_act="relu2", use_mamba_kernels=False,
                                          ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
                                          conv_kernel=4, expand=2, chunk_size=16, use_conv_bias=True,
                                          mamba_proj_bias=False, time_step_limit=[0.0, 1.0e4],
                                          layer_norm_epsilon=1e-5, residual_in_fp32=False,
                                          tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                                          use_bias=False, num_logits_to_keep=1)),
        # gated delta-net (3 linear) + gated full attention (1), MoE with shared expert
        "qwen3_next": ("qwen3_next", dict(common, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                          rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
                                          linear_conv_kernel_dim=4, linear_key_head_dim=16,
                                          linear_value_head_dim=16, linear_num_key_heads=2,
                                          linear_num_value_heads=4, decoder_sparse_step=1,
                                          moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                          num_experts_per_tok=2, num_experts=8, norm_topk_prob=True,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                           "partial_rotary_factor": 0.25})),
    }
    return fams


def make_config(model_type, kw):
    from transformers import AutoConfig
    kw = dict(kw)
    try:
        return AutoConfig.for_model(model_type, **kw)
    except TypeError as e:
        # a field this version does not know: drop it and say so
        log(f"  config {model_type}: {e}; retrying without unknown fields")
        cls = type(AutoConfig.for_model(model_type))
        known = set(getattr(cls, "__dataclass_fields__", {}) or {})
        if not known:
            import inspect
            known = set(inspect.signature(cls.__init__).parameters)
        dropped = [k for k in kw if k not in known]
        for k in dropped:
            kw.pop(k)
        log(f"  dropped fields: {dropped}")
        return AutoConfig.for_model(model_type, **kw)


# --------------------------------------------------------------------------- prompts

def candidate_prompts(seed):
    """Singles of several lengths, then shared-prefix pairs (prefix 56 tokens, then they diverge)."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(VOCAB) for _ in range(n)]
    singles = []
    for n, m in [(5, 16), (17, 12), (40, 12), (100, 8), (9, 16), (24, 12), (64, 10), (31, 12), (77, 8),
                 (13, 16), (50, 12), (100, 10), (3, 16), (88, 8)]:
        singles.append({"prompt_ids": tok(n), "max_tokens": m})
    pairs = []
    for _ in range(4):
        prefix = tok(56)
        a = tok(8)
        b = tok(12)
        while b[0] == a[0]:
            b[0] = rng.randrange(VOCAB)
        pairs.append(({"prompt_ids": prefix + a, "max_tokens": 12}, {"prompt_ids": prefix + b, "max_tokens": 12}))
    return singles, pairs


# --------------------------------------------------------------------------- generation

def greedy_generate(model, ids, n, device):
    from transformers import GenerationConfig
    inp = torch.tensor([ids], dtype=torch.long, device=device)
    gc = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=n, output_logits=True,
                          return_dict_in_generate=True, use_cache=True, eos_token_id=None, pad_token_id=None,
                          bos_token_id=None, temperature=None, top_p=None, top_k=None)
    with torch.no_grad():
        out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), generation_config=gc)
    seq = out.sequences[0, len(ids):].tolist()
    logits = torch.stack([l[0] for l in out.logits], 0).float().cpu()
    if len(seq) != n or logits.shape[0] != n:
        raise RuntimeError(f"generate returned {len(seq)} tokens / {logits.shape[0]} logits, want {n}")
    am = logits.argmax(-1).tolist()
    if am != seq:
        raise RuntimeError(f"generate's tokens {seq} are not the argmax of its raw logits {am}")
    return seq, logits


def greedy_nocache(model, ids, n, device):
    cur = list(ids)
    rows = []
    with torch.no_grad():
        for _ in range(n):
            inp = torch.tensor([cur], dtype=torch.long, device=device)
            lg = model(input_ids=inp, attention_mask=torch.ones_like(inp), use_cache=False).logits[0, -1].float().cpu()
            rows.append(lg)
            cur.append(int(lg.argmax()))
    return cur[len(ids):], torch.stack(rows, 0)


def top_logprobs(logits, k=5):
    lp = torch.log_softmax(logits.double(), -1)   # logits are float32; softmax in float64 for a clean golden
    v, i = lp.topk(k, -1)
    return [[[int(i[s, j]), float(v[s, j])] for j in range(k)] for s in range(lp.shape[0])]


def min_gap(logits):
    v, _ = logits.topk(2, -1)
    return float((v[:, 0] - v[:, 1]).min())


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    seen = set()
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point() or t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            t.mul_(1 + PERTURB_REL * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype))


def randomize_small_params(model, seed):
    """Norm weights and the MoE score-correction bias would otherwise be constants (1 or 0)."""
    g = torch.Generator().manual_seed(seed)
    touched = []
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if t.dim() == 1 and "norm" in name:
                t.add_(NORM_NOISE * torch.randn(t.shape, generator=g).to(t.dtype))
                touched.append(name)
            elif "e_score_correction_bias" in name:
                t.copy_(0.05 * torch.randn(t.shape, generator=g).to(t.dtype))
                touched.append(name)
    return touched


# --------------------------------------------------------------------------- one family

def quantize_fp8(d, block):
    """Rewrite d/model.safetensors with the 2-D *_proj weights in float8_e4m3fn plus float32 block
    scales (<name>_scale_inv), add quantization_config to d/config.json, and write the dequantized
    float32 checkpoint (fp8 x scale, config unchanged) to d + ".f32"; return that directory."""
    import shutil
    from safetensors.torch import load_file, save_file
    br, bc = block
    sd = load_file(os.path.join(d, "model.safetensors"))
    fp8, deq = {}, {}
    for k, w in sd.items():
        if w.dim() == 2 and k.endswith(".weight") and "_proj" in k:
            w = w.float()
            R, C = w.shape
            sr, sc = -(-R // br), -(-C // bc)
            pad = torch.zeros(sr * br, sc * bc, dtype=torch.float32)
            pad[:R, :C] = w.abs()
            amax = pad.view(sr, br, sc, bc).amax(dim=(1, 3))
            scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax)).float()
            full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:R, :C]
            q = (w / full).to(torch.float8_e4m3fn)
            fp8[k], fp8[k + "_scale_inv"] = q.contiguous(), scale.contiguous()
            deq[k] = (q.float() * full).contiguous()
        else:
            fp8[k] = deq[k] = w
    ddir = d + ".f32"
    os.makedirs(ddir, exist_ok=True)
    shutil.copy(os.path.join(d, "config.json"), os.path.join(ddir, "config.json"))
    save_file(deq, os.path.join(ddir, "model.safetensors"), metadata={"format": "pt"})
    save_file(fp8, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [br, bc]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return ddir


def build_family(name, model_type, kw, root, fam_seed, fp8_block=None):
    from transformers import AutoModelForCausalLM
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    rep = {"model_type": model_type, "seed": fam_seed}
    t0 = time.time()

    torch.manual_seed(fam_seed)
    cfg = make_config(model_type, kw)
    try:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model = model.float().eval()
    rep["touched_small_params"] = randomize_small_params(model, fam_seed + 1)
    model.save_pretrained(d)
    for extra in ("generation_config.json",):
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)
    files = sorted(os.listdir(d))
    if "model.safetensors" not in files:
        raise RuntimeError(f"save_pretrained wrote {files}, not one model.safetensors")
    ctext = open(os.path.join(d, "config.json")).read()
    rep["config_json_nonfinite"] = any(s in ctext for s in ("Infinity", "NaN"))

    # Reload from the files: every run below uses exactly what the Go side will read
    # (for fp8, the dequantized weights the Go loader computes from the fp8 files).
    src = quantize_fp8(d, fp8_block) if fp8_block else d
    if fp8_block:
        rep["fp8_block"] = list(fp8_block)
        ctext = open(os.path.join(d, "config.json")).read()
    model, info = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager", dtype=torch.float32,
                                                       output_loading_info=True)
    if fp8_block:
        import shutil
        shutil.rmtree(src)
    model = model.float().eval()
    info = {k: sorted(map(str, v)) for k, v in info.items() if v}
    rep["loading_info"] = info
    if info.get("missing_keys") or info.get("mismatched_keys"):
        raise RuntimeError(f"reload is not a round trip: {info}")

    from safetensors import safe_open
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        rep["tensors"] = {k: [str(f.get_slice(k).get_dtype()), list(f.get_slice(k).get_shape())] for k in f.keys()}
    rep["n_params_file"] = sum(int(torch.tensor(s[1]).prod()) if s[1] else 1 for s in rep["tensors"].values())
    rep["bytes"] = {fn: os.path.getsize(os.path.join(d, fn)) for fn in os.listdir(d)}
    rep["config"] = json.loads(ctext)
    rep["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    rep["model_class"] = type(model).__name__

    cpu = model
    gpu = copy.deepcopy(model).to("cuda").eval()
    pert = copy.deepcopy(model)
    perturb(pert, fam_seed + 2)
    pert = pert.to("cuda").eval()

    singles, pairs = candidate_prompts(fam_seed + 3)
    mode = "generate"

    def run_one(p):
        nonlocal mode
        ids, n = p["prompt_ids"], p["max_tokens"]
        res = {}
        for tag, m, dev in (("cpu", cpu, "cpu"), ("gpu", gpu, "cuda"), ("gpu_perturbed", pert, "cuda")):
            if mode == "generate":
                try:
                    res[tag] = greedy_generate(m, ids, n, dev)
                    continue
                except Exception as e:  # fall back to no-cache greedy for the whole family
                    log(f"  {name}: generate failed ({type(e).__name__}: {e}); using no-cache greedy")
                    traceback.print_exc()
                    mode = "nocache"
                    return run_one(p)
            res[tag] = greedy_nocache(m, ids, n, dev)
        try:
            res["cpu_nocache"] = greedy_nocache(cpu, ids, n, "cpu")
        except Exception as e:
            res["cpu_nocache"] = None
            log(f"  {name}: no-cache check failed: {e}")
        return res

    def verdict(p, res):
        c, g, q = res["cpu"][0], res["gpu"][0], res["gpu_perturbed"][0]
        gap = min(min_gap(res[t][1]) for t in ("cpu", "gpu", "gpu_perturbed"))
        v = {"len": len(p["prompt_ids"]), "max_tokens": p["max_tokens"], "cpu": c, "gpu": g, "gpu_perturbed": q,
             "same_3": c == g == q, "min_top2_gap": gap,
             "nocache_same": (res["cpu_nocache"] is not None and res["cpu_nocache"][0] == c)}
        lpc = torch.log_softmax(res["cpu"][1].double(), -1)
        dl = [float((lpc - torch.log_softmax(res[t][1].double(), -1)).abs().max()) if res[t][0] == c else None
              for t in ("gpu", "gpu_perturbed")]
        v["max_abs_logprob_diff_cpu_gpu"], v["max_abs_logprob_diff_cpu_gpu_perturbed"] = dl
        v["logprobs_close"] = all(x is not None and x <= LOGPROB_TOL for x in dl)
        if not torch.isfinite(res["cpu"][1]).all():
            v["nonfinite_logits"] = True
        v["keep"] = v["same_3"] and gap >= NEAR_TIE and v["logprobs_close"] and not v.get("nonfinite_logits")
        return v

    cand = []
    kept_singles, kept_pairs = [], []
    for p in singles:
        res = run_one(p)
        v = verdict(p, res)
        cand.append(dict(v, kind="single"))
        if v["keep"] and len(kept_singles) < MAX_SINGLES:
            kept_singles.append((p, res))
    for a, b in pairs:
        ra, rb = run_one(a), run_one(b)
        va, vb = verdict(a, ra), verdict(b, rb)
        cand.append(dict(va, kind="pair_a"))
        cand.append(dict(vb, kind="pair_b"))
        if va["keep"] and vb["keep"] and len(kept_pairs) < MAX_PAIRS:
            kept_pairs.append(((a, ra), (b, rb)))

    kept = list(kept_singles)
    pair_idx = []
    for (a, b) in kept_pairs:
        pair_idx.append([len(kept), len(kept) + 1])
        kept += [a, b]
    with open(os.path.join(d, "prompts.jsonl"), "w") as f:
        for p, _ in kept:
            f.write(json.dumps({"prompt_ids": p["prompt_ids"], "max_tokens": p["max_tokens"]}) + "\n")
    exp = [{"output_ids": r["cpu"][0], "top_logprobs": top_logprobs(r["cpu"][1])} for _, r in kept]
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f)
    for _, r in kept:  # expected.json is the cpu run; check the GPU run agrees
        assert r["cpu"][0] == r["gpu"][0]

    n_cand = len(singles) + 2 * len(pairs)
    rep.update({
        "generation_mode": mode,
        "candidates": n_cand,
        "kept": len(kept),
        "dropped": sum(1 for v in cand if not v["keep"]),
        "unused_over_cap_or_partner_dropped": n_cand - len(kept) - sum(1 for v in cand if not v["keep"]),
        "dropped_not_same_3": sum(1 for v in cand if not v["same_3"]),
        "dropped_near_tie": sum(1 for v in cand if v["same_3"] and v["min_top2_gap"] < NEAR_TIE),
        "dropped_logprobs_not_close": sum(1 for v in cand if v["same_3"] and v["min_top2_gap"] >= NEAR_TIE
                                          and not v["logprobs_close"]),
        "shared_prefix_pairs": pair_idx,
        "shared_prefix_len": 56,
        "kept_prompt_lens": [len(p["prompt_ids"]) for p, _ in kept],
        "kept_min_top2_gap": min(min_gap(r["cpu"][1]) for _, r in kept) if kept else None,
        "kept_max_abs_logprob_diff_cpu_gpu": max((float((torch.log_softmax(r["cpu"][1].double(), -1) -
                                                         torch.log_softmax(r["gpu"][1].double(), -1)).abs().max())
                                                  for _, r in kept), default=None),
        "nocache_disagreements_all_candidates": sum(1 for v in cand if not v["nocache_same"]),
        "candidates_detail": cand,
        "seconds": round(time.time() - t0, 2),
    })
    rep["bytes"] = {fn: os.path.getsize(os.path.join(d, fn)) for fn in sorted(os.listdir(d))}
    del gpu, pert
    torch.cuda.empty_cache()
    return rep


# --------------------------------------------------------------------------- notes

def write_notes(path, srcdir):
    """Excerpts of the installed modeling code the Go side must match; and the files themselves."""
    import importlib
    import inspect
    import shutil
    wanted = {
        "deepseek_v32": ["Indexer", "apply_rotary", "rotate", "Attention", "TopkRouter", "MoE", "yarn", "mscale"],
        "nemotron_h": ["Mixer", "RMSNorm", "Gated", "pad_tensor", "segment_sum", "reshape_into_chunks",
                       "Attention", "MLP", "Block", "apply_mask"],
        "deepseek_v3": ["Attention", "TopkRouter", "MoE", "yarn", "mscale", "apply_rotary", "rotate"],
        "qwen3_next": ["GatedDeltaNet", "gated_delta", "RMSNormGated", "l2norm", "Attention", "apply_rotary"],
    }
    # objects the modeling code calls that live elsewhere (reference kernels, shared norms)
    extra_names = {
        "deepseek_v32": ["DeepseekV32RMSNorm", "DeepseekV32Experts", "DeepseekV32MLP", "DeepseekV32RotaryEmbedding",
                         "DeepseekV32DecoderLayer"],
        "nemotron_h": ["Zamba2RMSNormGated", "MambaRMSNormGated", "causal_conv1d_fn", "causal_conv1d_update",
                       "mamba2_chunk_scan", "mamba2_selective_state_update", "NemotronHModel"],
        "deepseek_v3": ["DeepseekV3RMSNorm", "DeepseekV3NaiveMoe", "DeepseekV3Experts", "DeepseekV3MLP"],
        "qwen3_next": ["Qwen3NextRMSNorm", "Qwen3NextSparseMoeBlock", "Qwen3NextExperts", "Qwen3NextDecoderLayer",
                       "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "causal_conv1d_fn",
                       "causal_conv1d_update", "Qwen3NextDynamicCache"],
    }
    os.makedirs(srcdir, exist_ok=True)
    with open(path, "w") as out:
        import transformers
        out.write(f"transformers {transformers.__version__} at {os.path.dirname(transformers.__file__)}\n")
        try:
            from transformers.utils import import_utils as iu
            for fn in ("is_mamba_2_ssm_available", "is_causal_conv1d_available", "is_flash_linear_attention_available"):
                if hasattr(iu, fn):
                    out.write(f"{fn}: {getattr(iu, fn)()}\n")
        except Exception as e:
            out.write(f"availability probe failed: {e}\n")
        for fam, keys in wanted.items():
            modname = f"transformers.models.{fam}.modeling_{fam}"
            try:
                mod = importlib.import_module(modname)
            except Exception as e:
                out.write(f"\n#### {modname}: import failed: {e}\n")
                continue
            shutil.copy(mod.__file__, os.path.join(srcdir, os.path.basename(mod.__file__)))
            out.write(f"\n\n######## {modname} ({mod.__file__})\n")
            for nm, obj in vars(mod).items():
                if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                    continue
                if getattr(obj, "__module__", None) != mod.__name__:
                    continue
                if not any(k.lower() in nm.lower() for k in keys):
                    continue
                try:
                    out.write(f"\n#### {nm}\n{inspect.getsource(obj)}\n")
                except Exception as e:
                    out.write(f"\n#### {nm}: no source ({e})\n")
            for nm in extra_names.get(fam, []):
                obj = getattr(mod, nm, None)
                if obj is None:
                    out.write(f"\n#### (extra) {nm}: not in module\n")
                    continue
                for o in {id(obj): obj, id(inspect.unwrap(obj)): inspect.unwrap(obj)}.values():
                    for attr in ("", "__wrapped__", "func", "_fallback", "fallback", "reference"):
                        oo = getattr(o, attr, None) if attr else o
                        if oo is None:
                            continue
                        try:
                            src = inspect.getsource(oo)
                            sf = inspect.getsourcefile(oo)
                            out.write(f"\n#### (extra) {nm}{'.' + attr if attr else ''} from {sf}\n{src}\n")
                            shutil.copy(sf, os.path.join(srcdir, sf.split("site-packages/")[-1].replace("/", "__")))
                        except Exception as e:
                            out.write(f"\n#### (extra) {nm}{'.' + attr if attr else ''}: no source ({e})\n")
        for extra in ("modeling_rope_utils", "integrations.moe", "masking_utils", "cache_utils"):
            try:
                mod = importlib.import_module("transformers." + extra)
                shutil.copy(mod.__file__, os.path.join(srcdir, extra.replace(".", "_") + ".py"))
            except Exception as e:
                out.write(f"\n(copy of {extra} failed: {e})\n")
        try:
            from transformers import modeling_rope_utils as ru
            for nm in ("_compute_default_rope_parameters", "_compute_llama3_parameters", "_compute_yarn_parameters"):
                if hasattr(ru, nm):
                    out.write(f"\n\n######## modeling_rope_utils.{nm}\n{inspect.getsource(getattr(ru, nm))}\n")
        except Exception as e:
            out.write(f"rope utils: {e}\n")


# --------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default="")
    ap.add_argument("--notes", default="")
    ap.add_argument("--src", default="")
    ap.add_argument("--fp8-block", default="", help="R,C: also make deepseek_v3_fp8 with R x C block scales")
    a = ap.parse_args()
    fp8_block = tuple(int(x) for x in a.fp8_block.split(",")) if a.fp8_block else None
    if fp8_block is not None and (len(fp8_block) != 2 or min(fp8_block) < 1):
        ap.error(f"--fp8-block {a.fp8_block!r}: want two integers >= 1, R,C")

    import safetensors
    import transformers
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(SEED)
    os.makedirs(a.out, exist_ok=True)

    versions = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "safetensors": safetensors.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32},
        "command": "python3 scripts/hf_goldens.py " + " ".join(sys.argv[1:]),
    }
    log(json.dumps(versions))
    with open(os.path.join(a.out, "versions.json"), "w") as f:
        json.dump(versions, f, indent=1)

    if a.notes:
        try:
            write_notes(a.notes, a.src or os.path.join(os.path.dirname(a.notes), "modeling_src"))
        except Exception:
            traceback.print_exc()

    fams = families()
    if fp8_block:
        fams["deepseek_v3_fp8"] = fams["deepseek_v3"]
    want = [x for x in a.families.split(",") if x] or list(fams)
    report = {"seed": SEED, "vocab": VOCAB, "initializer_range": INIT_RANGE, "norm_noise": NORM_NOISE,
              "perturb_rel": PERTURB_REL, "near_tie": NEAR_TIE, "families": {}, "skipped": {}}
    for i, name in enumerate(want):
        model_type, kw = fams[name]
        log(f"== {name} ({model_type})")
        try:
            # the seed follows the family's place in families(), not in --families, so a subset reproduces
            # deepseek_v3_fp8 takes deepseek_v3's seed: the same random weights, quantized
            base = name[:-len("_fp8")] if name.endswith("_fp8") else name
            rep = build_family(name, model_type, kw, a.out, SEED + 100 * (list(fams).index(base) + 1),
                               fp8_block if name.endswith("_fp8") else None)
            report["families"][name] = rep
            log(f"  kept {rep['kept']}/{rep['candidates']} (not same in 3 runs: {rep['dropped_not_same_3']}, "
                f"near tie: {rep['dropped_near_tie']}, logprobs not close: {rep['dropped_logprobs_not_close']}), pairs {rep['shared_prefix_pairs']}, "
                f"mode {rep['generation_mode']}, min gap {rep['kept_min_top2_gap']}, "
                f"max |dlogprob| cpu/gpu {rep['kept_max_abs_logprob_diff_cpu_gpu']}, "
                f"nocache disagreements {rep['nocache_disagreements_all_candidates']}, bytes {rep['bytes']}, "
                f"{rep['seconds']}s")
            for v in rep["candidates_detail"]:
                if not v["keep"]:
                    log(f"    dropped {v['kind']} len {v['len']}: cpu {v['cpu']} gpu {v['gpu']} "
                        f"pert {v['gpu_perturbed']} gap {v['min_top2_gap']:.3g} "
                        f"dlogprob {v['max_abs_logprob_diff_cpu_gpu']} {v['max_abs_logprob_diff_cpu_gpu_perturbed']}")
        except Exception as e:
            traceback.print_exc()
            report["skipped"][name] = f"{type(e).__name__}: {e}"
            import shutil
            shutil.rmtree(os.path.join(a.out, name), ignore_errors=True)
            log(f"  SKIPPED {name}: {e}")
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    log("done:", {k: (v["kept"], v["dropped"]) for k, v in report["families"].items()}, "skipped:",
        list(report["skipped"]))


if __name__ == "__main__":
    main()
