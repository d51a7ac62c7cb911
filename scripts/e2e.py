#!/usr/bin/env python3
"""End to end on the GPU machine (step e2e of scripts/gpu-run.sh): kvx's cuda
device on a full-size random-weight Llama-3-8B checkpoint against
transformers eager bf16 (sdpa) on the same prompts, in one run.

1. The checkpoint: transformers builds LlamaForCausalLM with Llama-3.1-8B's
   config (32 layers, bf16, random weights, seed 0) and saves it to --ckpt
   (reused when it is there). Its files are read once so the page cache
   holds them, as the load goal assumes.
2. The limits measured in the same run: device-to-device copy bandwidth
   (torch copy_ of 4 GiB, read + write) and cuBLAS's bf16 matmul rate
   (torch.matmul 8192 x 4096 x 4096).
3. transformers: batch-1 decode (32 prompt + 128 new tokens, TPOT from two
   generate calls), prefill of 64 x 2048 tokens (logits of the last
   position only), and 64 x 2048 + 256 new tokens (output tok/s).
4. kvx (bin/kvx run, scenarios/e2e-llama8b.yaml, the default dtype: the fast
   numerics): load (the wall time of a 1-token run), batch-1/8/64 decode
   TPOT, prefill of 64 x 2048 (engine time of a 1-token run), and 64 x 2048 +
   256 (TTFT, TPOT p50/p99, output tok/s); batch-1 TPOT also with dtype
   float32 (the exact numerics) for reference.
5. kvx serve on the checkpoint under 64 streaming clients (kvx bench, 256
   generated prompts of 1024 token ids + 128 new): TTFT and TPOT p50/p99,
   output tok/s.

Writes OUT/e2e.json and OUT/e2e.md (the table with each goal met or not).
Usage: python3 scripts/e2e.py --kvx bin/kvx --scenario scenarios/e2e-llama8b.yaml --out OUT [--ckpt DIR] [--skip-hf]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def make_checkpoint(d):
    if os.path.isfile(os.path.join(d, "config.json")) and any(f.endswith(".safetensors") for f in os.listdir(d)):
        log(f"checkpoint: reusing {d}")
        return
    from transformers import LlamaConfig, LlamaForCausalLM
    t0 = time.time()
    torch.manual_seed(0)
    cfg = LlamaConfig(**{k: v for k, v in LLAMA_8B.items() if k != "architectures"})
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.config.architectures = LLAMA_8B["architectures"]
    model.save_pretrained(d, safe_serialization=True, max_shard_size="5GB")
    del model
    torch.cuda.empty_cache()
    log(f"checkpoint: made {d} in {time.time() - t0:.1f} s")


def warm_page_cache(d):
    n = 0
    for f in sorted(os.listdir(d)):
        with open(os.path.join(d, f), "rb") as fh:
            while True:
                b = fh.read(64 << 20)
                if not b:
                    break
                n += len(b)
    return n


def cuda_time(f, reps):
    f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def limits():
    x = torch.empty(1 << 31, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    s = cuda_time(lambda: y.copy_(x), 10)
    copy = 2 * x.numel() * 2 / s
    del x, y
    a = torch.randn(8192, 4096, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    s = cuda_time(lambda: a @ b, 20)
    flops = 2 * 8192 * 4096 * 4096 / s
    return {"copy_GBps": copy / 1e9, "cublas_bf16_TFLOPs": flops / 1e12, "gpu": torch.cuda.get_device_name()}


def prompts(n, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1000, 120000, (n, length), generator=g)


def hf_baseline(d):
    from transformers import AutoModelForCausalLM, GenerationConfig
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="sdpa").to("cuda").eval()

    def gen(ids, n):
        gc = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0,
                              temperature=None, top_p=None, top_k=None)
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    res = {}
    p1 = prompts(1, 32, 1).cuda()
    gen(p1, 4)  # warm-up
    t1, t128 = gen(p1, 1), gen(p1, 128)
    res["b1_tpot_ms"] = (t128 - t1) / 127 * 1e3
    p64 = prompts(64, 2048, 2).cuda()

    def prefill():
        with torch.no_grad():
            for i in range(0, 64, 8):
                model(input_ids=p64[i:i + 8], logits_to_keep=1)
    res["prefill_64x2048_s"] = cuda_time(prefill, 2)
    t = gen(p64, 256)
    res["gen_64x2048_256_s"] = t
    res["gen_64x2048_256_out_tok_s"] = 64 * 256 / t
    del model
    torch.cuda.empty_cache()
    return res


def nsys_path():
    """nsys on PATH, or the one Nsight Compute or Systems installs (the GPU
    machine has it only inside Nsight Compute's directory)."""
    import glob
    import shutil
    installed = sorted(glob.glob("/opt/nvidia/nsight-*/*/host/target-linux-x64/nsys") +
                       glob.glob("/opt/nvidia/nsight-systems/*/bin/nsys"))
    return shutil.which("nsys") or (installed[-1] if installed else "nsys")


def nsys_gaps(rep, out, tag):
    """Where a run's GPU time goes between kernels, from an Nsight Systems
    report of it: the union of its kernel and copy intervals, and the gaps
    between them, split at 50 us into gaps inside a step (the GPU waiting
    for a launch) and gaps between steps (the engine, the manager and the
    sampled tokens' trip to the host). Written to OUT/nsys-TAG.txt."""
    import sqlite3
    db = rep[:-len(".nsys-rep")] + ".sqlite"
    subprocess.run([nsys_path(), "export", "--type", "sqlite", "--force-overwrite", "true", "-o", db, rep],
                   capture_output=True, text=True, timeout=600)
    con = sqlite3.connect(db)
    iv = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        try:
            iv += con.execute(f"SELECT start, end FROM {table}").fetchall()
        except sqlite3.Error:
            pass
    kernels = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    iv.sort()
    # The steady state: drop the first and last 10% of the run (load, warm-up, drain).
    lo, hi = iv[len(iv) // 10][0], iv[len(iv) * 9 // 10][1]
    busy, inside, between, steps = 0, 0, 0, 0
    cur_s, cur_e = None, None
    for s0, e0 in iv:
        if e0 < lo or s0 > hi:
            continue
        s0, e0 = max(s0, lo), min(e0, hi)
        if cur_e is None:
            cur_s, cur_e = s0, e0
            continue
        if s0 > cur_e:
            busy += cur_e - cur_s
            gap = s0 - cur_e
            if gap >= 50_000:
                between += gap
                steps += 1
            else:
                inside += gap
            cur_s, cur_e = s0, e0
        else:
            cur_e = max(cur_e, e0)
    if cur_e is not None:
        busy += cur_e - cur_s
    span = hi - lo
    lines = [f"nsys {tag}: {kernels} kernels in the run; steady window {span / 1e6:.1f} ms ({steps} gaps of 50 us or more)",
             f"  GPU busy (kernels and copies, overlaps merged) {busy / 1e6:.1f} ms = {100 * busy / span:.1f}%",
             f"  gaps inside steps (< 50 us) {inside / 1e6:.1f} ms = {100 * inside / span:.1f}%",
             f"  gaps between steps (>= 50 us) {between / 1e6:.1f} ms = {100 * between / span:.1f}%"]
    if steps:
        lines.append(f"  per step: {span / steps / 1e3:.3f} ms, of which GPU idle inside {inside / steps / 1e3:.3f} ms, "
                     f"between {between / steps / 1e3:.3f} ms")
    txt = "\n".join(lines)
    open(os.path.join(out, f"nsys-{tag}.txt"), "w").write(txt + "\n")
    log(txt)
    return {"busy_pct": 100 * busy / span, "inside_gap_pct": 100 * inside / span, "between_gap_pct": 100 * between / span,
            "steps": steps}


def kvx_run(kvx, scen, ckpt, out, tag, sets, timeout=600, prof=False, nsys=False):
    js = os.path.join(out, f"e2e-kvx-{tag}.json")
    cmd = [kvx, "run", "-c", scen, "--set", f"model={ckpt}", "--json", js, "--no-progress"]
    rep = None
    if nsys:
        rep = os.path.join("/tmp", f"kvx-nsys-{tag}.nsys-rep")
        cmd = [nsys_path(), "profile", "-t", "cuda", "--force-overwrite", "true", "-o", rep] + cmd
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ)
    if prof:
        # The cuda worker's own kernel timer (CUDA events around every
        # launch; device/cuda/prof.go): per-kernel GPU time, GPU span and
        # wall time a step.
        env["CUDA_KVX_PROFILE"] = os.path.join(out, f"prof-{tag}.txt")
    log("kvx:", " ".join(cmd))
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        log(f"kvx {tag}: no end within {timeout} s")
        return {"error": f"timeout {timeout} s", "wall_s": time.perf_counter() - t}
    wall = time.perf_counter() - t
    with open(os.path.join(out, f"e2e-kvx-{tag}.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        log(f"kvx {tag}: exit {p.returncode}\n{p.stderr[-2000:]}")
        return {"error": f"exit {p.returncode}", "wall_s": wall}
    if prof and os.path.isfile(env["CUDA_KVX_PROFILE"]):
        log(open(env["CUDA_KVX_PROFILE"]).read())
    doc = json.load(open(js))
    v = doc["variants"][0]
    lat, thr = v.get("latency") or {}, v.get("throughput") or {}
    gaps = {}
    if rep:
        try:
            gaps = {"nsys": nsys_gaps(rep, out, tag)}
        except Exception as e:  # a profile that cannot be read leaves the run's figures
            log(f"nsys {tag}: {e}")
    return gaps | {"wall_s": wall, "ttft_p50_ms": lat.get("ttft_p50_ms"), "ttft_p99_ms": lat.get("ttft_p99_ms"),
            "tpot_p50_ms": lat.get("tpot_p50_ms"), "tpot_p99_ms": lat.get("tpot_p99_ms"),
            "out_tok_s": thr.get("output_tokens_per_s"), "engine_s": thr.get("engine_s")}


def kvx_serve_bench(kvx, scen, ckpt, out, tag, clients, requests, prompt, new, timeout=600):
    """kvx serve of the checkpoint, then kvx bench against it: requests
    generated prompts of prompt token ids, new tokens each (ignore_eos), clients
    streaming in a closed loop; then SIGTERM, which must drain and exit 0."""
    import socket
    import urllib.request
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    slog = open(os.path.join(out, f"e2e-kvx-{tag}-server.log"), "w")
    cmd = [kvx, "serve", "-c", scen, "--set", f"model={ckpt}", "--set", f"max_batch_size={clients}", "--port", str(port)]
    log("kvx:", " ".join(cmd))
    t = time.perf_counter()
    srv = subprocess.Popen(cmd, stdout=slog, stderr=subprocess.STDOUT)
    res = {}
    try:
        while True:
            if srv.poll() is not None:
                return {"error": f"kvx serve exit {srv.returncode} before /health"}
            if time.perf_counter() - t > 300:
                return {"error": "kvx serve: /health not 200 within 300 s"}
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except Exception:
                time.sleep(0.2)
        res["ready_s"] = time.perf_counter() - t
        js = os.path.join(out, f"e2e-kvx-{tag}.json")
        bcmd = [kvx, "bench", "--url", url, "--concurrency", str(clients), "--requests", str(requests),
                "--prompt-tokens", str(prompt), "--output-tokens", str(new), "--json", js, "--no-progress"]
        log("kvx:", " ".join(bcmd))
        p = subprocess.run(bcmd, capture_output=True, text=True, timeout=timeout)
        with open(os.path.join(out, f"e2e-kvx-{tag}.log"), "w") as f:
            f.write(p.stdout + p.stderr)
        if p.returncode != 0:
            res["error"] = f"kvx bench exit {p.returncode}"
            log(p.stderr[-2000:])
            return res
        v = json.load(open(js))["variants"][0]
        lat, thr, rq = v.get("latency") or {}, v.get("throughput") or {}, v.get("requests") or {}
        res.update({"ttft_p50_ms": lat.get("ttft_p50_ms"), "ttft_p99_ms": lat.get("ttft_p99_ms"),
                    "tpot_p50_ms": lat.get("tpot_p50_ms"), "tpot_p99_ms": lat.get("tpot_p99_ms"),
                    "out_tok_s": thr.get("output_tokens_per_s"), "requests": rq})
    except subprocess.TimeoutExpired:
        res["error"] = f"kvx bench: no end within {timeout} s"
    finally:
        srv.terminate()
        try:
            res["serve_exit"] = srv.wait(timeout=120)
        except subprocess.TimeoutExpired:
            srv.kill()
            res["serve_exit"] = "killed after 120 s"
        slog.close()
    return res


def work(n, prompt, new):
    return [f"workload.requests={n}", f"workload.concurrency={n}", f"workload.prompt_tokens={prompt}",
            f"workload.output_tokens={new}"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvx", required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", default="/tmp/kvx-e2e/llama8b")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated kvx runs (serve64,load,b1,b1exact,b8,b64,prefill,gen)")
    ap.add_argument("--profile", default="", help="comma-separated kvx runs to profile with the worker's kernel timer (prof-<run>.txt beside)")
    ap.add_argument("--nsys", default="", help="comma-separated kvx runs to run under Nsight Systems (nsys-<run>.txt: GPU busy and idle gaps)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.ckpt, exist_ok=True)
    make_checkpoint(a.ckpt)
    ck_bytes = warm_page_cache(a.ckpt)
    weights = sum(os.path.getsize(os.path.join(a.ckpt, f)) for f in os.listdir(a.ckpt) if f.endswith(".safetensors"))
    res = {"checkpoint_bytes": ck_bytes, "weight_bytes": weights, "limits": limits()}
    log("limits:", res["limits"])
    if not a.skip_hf:
        res["transformers"] = hf_baseline(a.ckpt)
        log("transformers:", res["transformers"])
    runs = {
        "load": work(1, 32, 1),
        "b1": work(1, 32, 128),
        "b1exact": work(1, 32, 128) + ["dtype=float32"],
        "b8": work(8, 32, 128),
        "b64": work(64, 32, 128),
        "prefill": work(64, 2048, 1),
        "gen": work(64, 2048, 256),
        # for --profile: their times carry the profiler's overhead and are not in the table
        "b1prof": work(1, 32, 64),
        "b64prof": work(64, 32, 64),
        "prefillprof": work(8, 2048, 1),
        # for --nsys (under Nsight Systems: its times carry its tracing)
        "b1nsys": work(1, 32, 128),
        "b64nsys": work(64, 32, 128),
    }
    only = set(filter(None, a.only.split(",")))
    res["kvx"] = {}
    if not only or "serve64" in only:
        res["kvx"]["serve64"] = kvx_serve_bench(a.kvx, a.scenario, a.ckpt, a.out, "serve64", 64, 256, 1024, 128)
        log("kvx serve64:", res["kvx"]["serve64"])
    for tag, sets in runs.items():
        if only and tag not in only:
            continue
        res["kvx"][tag] = kvx_run(a.kvx, a.scenario, a.ckpt, a.out, tag, sets, prof=tag in a.profile.split(","), nsys=tag in a.nsys.split(","),
                                  timeout=int(os.environ.get("E2E_RUN_TIMEOUT", "600")))
        log(f"kvx {tag}:", res["kvx"][tag])
    json.dump(res, open(os.path.join(a.out, "e2e.json"), "w"), indent=1)
    write_table(res, os.path.join(a.out, "e2e.md"))


def write_table(res, path):
    lim, k, hf = res["limits"], res.get("kvx", {}), res.get("transformers", {})
    wread_ms = res["weight_bytes"] / (lim["copy_GBps"] * 1e9) * 1e3
    kv_tok = 32 * 8 * 128 * 2 * 2  # bytes of KV a token (bf16)

    def g(tag, key):
        v = k.get(tag, {}).get(key)
        return v if isinstance(v, (int, float)) else None

    rows = []

    def row(work, kvx, base, limit, goal, met, tag):
        if tag not in k:  # not asked for (--only): no row
            return
        rows.append(f"| {work} | {kvx} | {base} | {limit} | {goal} | {'met' if met else 'not met'} |")

    for tag, b in (("b1", 1), ("b8", 8), ("b64", 64)):
        t = g(tag, "tpot_p50_ms")
        lim_ms = (res["weight_bytes"] + b * 160 * kv_tok) / (lim["copy_GBps"] * 1e9) * 1e3
        factor = 1.15 if b == 1 else 1.3
        base = f"{hf['b1_tpot_ms']:.2f} ms" if b == 1 and "b1_tpot_ms" in hf else "—"
        row(f"decode step, batch {b} (TPOT p50)", f"{t:.2f} ms" if t else "failed", base,
            f"{lim_ms:.2f} ms", f"≤ {factor}× limit", t is not None and t <= factor * lim_ms, tag)
    t = g("b1exact", "tpot_p50_ms")
    if t:
        row("decode step, batch 1, dtype float32 (exact)", f"{t:.2f} ms", "—", f"{wread_ms:.2f} ms", "reference", False, "b1exact")
    w = g("load", "wall_s")
    row("kvx run to the end of a 1-token request (load)", f"{w:.1f} s" if w else "failed", "—", "a few seconds", "≤ 5 s", w is not None and w <= 5, "load")
    p = g("prefill", "engine_s")
    flops = 2 * 64 * 2048 * 7.5e9 + 4 * 32 * 4096 * 64 * 2048 * 2048 / 2
    lim_s = flops / (lim["cublas_bf16_TFLOPs"] * 1e12)
    base = f"{hf['prefill_64x2048_s']:.2f} s" if "prefill_64x2048_s" in hf else "—"
    row("prefill 64 × 2048", f"{p:.2f} s ({lim_s / p * 100:.0f}% of the cuBLAS-rate time)" if p else "failed", base,
        f"{lim_s:.2f} s", "≥ 75%", p is not None and lim_s / p >= 0.75, "prefill")
    o = g("gen", "out_tok_s")
    base = f"{hf['gen_64x2048_256_out_tok_s']:.0f} tok/s" if "gen_64x2048_256_out_tok_s" in hf else "—"
    extra = ""
    if o:
        extra = f" (TTFT p50 {g('gen', 'ttft_p50_ms'):.0f} / p99 {g('gen', 'ttft_p99_ms'):.0f} ms, TPOT p50 {g('gen', 'tpot_p50_ms'):.1f} / p99 {g('gen', 'tpot_p99_ms'):.1f} ms)"
    row("64 × 2048 + 256 new, output tok/s", f"{o:.0f} tok/s{extra}" if o else "failed", base, "—",
        "≥ 1.5× transformers", o is not None and "gen_64x2048_256_out_tok_s" in hf and o >= 1.5 * hf["gen_64x2048_256_out_tok_s"], "gen")
    o = g("serve64", "out_tok_s")
    if o:
        q = k["serve64"].get("requests") or {}
        extra = (f" (TTFT p50 {g('serve64', 'ttft_p50_ms'):.0f} / p99 {g('serve64', 'ttft_p99_ms'):.0f} ms, TPOT p50 "
                 f"{g('serve64', 'tpot_p50_ms'):.1f} / p99 {g('serve64', 'tpot_p99_ms'):.1f} ms; {q.get('completed', '?')}/{q.get('total', '?')} completed)")
        row("kvx serve, 64 streaming clients (kvx bench: 256 × 1024 + 128 new)", f"{o:.0f} tok/s{extra}", "—", "—", "reported", True, "serve64")
    elif "serve64" in k:
        row("kvx serve, 64 streaming clients", k["serve64"].get("error", "failed"), "—", "—", "reported", False, "serve64")
    head = [f"Measured on the {lim.get('gpu', 'GPU')} in one run: copy {lim['copy_GBps']:.0f} GB/s (read + write), cuBLAS bf16 "
            f"{lim['cublas_bf16_TFLOPs']:.0f} TFLOP/s; weights {res['weight_bytes'] / 1e9:.2f} GB, read once in {wread_ms:.2f} ms.", "",
            "| work | kvx (cuda, dtype bfloat16) | transformers eager bf16 (sdpa) | limit | goal | |", "|---|---|---|---|---|---|"]
    open(path, "w").write("\n".join(head + rows) + "\n")
    print("\n".join(head + rows))


if __name__ == "__main__":
    main()
