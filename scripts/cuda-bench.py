#!/usr/bin/env python3
"""cuda-bench.py: the cuda device's kernels against PyTorch on the same GPU, in one run.

Usage (on the GPU machine, from .gpu/run.sh's bench step):
    python3 cuda-bench.py --go-bench go-bench.txt --out DIR
    python3 cuda-bench.py --rewrite DIR/cuda-bench.json --go-bench go-bench.txt --out DIR   # no GPU

It measures the baselines with PyTorch and reads the Go benchmark lines of
the cuda test binary, then writes DIR/cuda-bench.json and DIR/cuda-bench.md:
one table, every kvx figure next to its baseline of the same run and the ratio.

  kvx (Go benchmark)                 baseline (PyTorch, same GPU, same run)
  BenchmarkCopy                      torch copy_ of 4 GiB
  BenchmarkDecodeGQA                 scaled_dot_product_attention, contiguous bf16 KV
  BenchmarkMLADecode                 absorbed MLA on contiguous bf16 latent (matmul, softmax, matmul)
  BenchmarkDSA                       kvx's own dense MLA decode on the same cache (the speed-up)
  BenchmarkGEMM                      torch.matmul bf16 (cuBLAS) on the same shapes
  BenchmarkMatMul (exact fp32)       torch.matmul bf16 (cuBLAS) 8192x4096x4096

--rewrite re-reads the kvx figures of a saved run from its Go benchmark lines
(the baselines stay as measured) and writes the table again.
"""
import argparse
import json
import math
import re
import sys
import time

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
CTXS = [4 << 10, 32 << 10, 128 << 10]
BATCHES = [1, 16, 64]
MLA_HEADS, MLA_DK, MLA_DV = 128, 576, 512  # DeepSeek-V3: 128 heads, latent 512 + rope 64
DSA_CTXS = [32 << 10, 128 << 10]
GEMMS = [(8192, 4096, 4096), (8192, 7168, 2048)]


def timed(fn, iters):
    import torch

    # Warm up for at least 50 ms (three calls at least): the first short
    # kernels of a process ran at about half speed (clocks still rising).
    t0, n = time.time(), 0
    while n < 3 or time.time() - t0 < 0.05:
        fn()
        torch.cuda.synchronize()
        n += 1
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def sdpa_decode(ctx, batch):
    import torch
    import torch.nn.functional as F

    q = torch.randn(batch, HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    t = timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), 20)
    del q, k, v
    torch.cuda.empty_cache()
    return 2 * batch * ctx * KV_HEADS * HEAD_DIM * 2 / t / 1e9


def mla_decode(ctx, batch):
    """Absorbed MLA decode in PyTorch on a contiguous bf16 latent: S = Q·C^T
    over 576 dims (bf16 out of cuBLAS), softmax in float32, O = P·C[..., :512].
    Returns the latent bytes read per second (GB/s), as kvx's figure."""
    import torch

    q = torch.randn(batch, MLA_HEADS, MLA_DK, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(batch, ctx, MLA_DK, device="cuda", dtype=torch.bfloat16)
    scale = 1 / math.sqrt(192)

    def f():
        s = torch.matmul(q, c.transpose(1, 2))
        p = torch.softmax(s.float() * scale, dim=-1).to(torch.bfloat16)
        return torch.matmul(p, c[..., :MLA_DV])

    t = timed(f, 10)
    del q, c
    torch.cuda.empty_cache()
    return batch * ctx * MLA_DK * 2 / t / 1e9


def copy_bandwidth():
    import torch

    n = 4 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 20)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / t / 1e9


def gemm_tflops(m, n, k):
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: a @ b.T, 20)
    return 2 * m * n * k / t / 1e12


LINE = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$")


def go_results(path):
    """name -> {unit: value} for every benchmark line (ns/op included)."""
    out = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            toks = m.group(3).split()
            out[m.group(1)] = {u: float(v) for v, u in zip(toks[0::2], toks[1::2])}
    return out


def go_value(go, key, unit):
    return go.get(key, {}).get(unit)


def exact_matmul(go):
    """The exact fp32 matmul's prefill-shaped case (most rows)."""
    best = (0, None)
    for key, ms in go.items():
        mm = re.match(r"BenchmarkMatMul/(\d+)x", key)
        if mm and "TFLOP/s" in ms and int(mm.group(1)) > best[0]:
            best = (int(mm.group(1)), ms["TFLOP/s"])
    return best


def fill(res, go):
    """Fills every row's kvx figures from the Go benchmark lines."""
    for r in res["rows"]:
        if r["go"] == "MatMul":
            rows_seen, r["kvx"] = exact_matmul(go)
            r["shape"] = f"kvx {rows_seen}×4096×4096, cuBLAS 8192×4096×4096"
        else:
            r["kvx"] = go_value(go, r["go"], r["go_unit"])
        if r.get("baseline_go"):
            r["baseline_value"] = go_value(go, r["go"], r["baseline_go"])
        for name, unit in r.get("extra", {}).items():
            r.setdefault("extra_values", {})[name] = go_value(go, r["go"], unit)
        if r["kvx"] and r["baseline_value"]:
            # rates: kvx / baseline; times (lower is better): baseline / kvx
            r["ratio"] = r["baseline_value"] / r["kvx"] if r["unit"] == "µs" else r["kvx"] / r["baseline_value"]
        else:
            r["ratio"] = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--go-bench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rewrite", metavar="JSON", help="rewrite the table from an earlier run's cuda-bench.json and its --go-bench lines (no GPU)")
    args = ap.parse_args()
    go = go_results(args.go_bench)
    if args.rewrite:
        res = json.load(open(args.rewrite))
        fill(res, go)
        write(res, args.out)
        return
    import torch

    def row(what, shape, key, unit, baseline, value, go_unit=None, extra=None, baseline_go=None):
        r = {"what": what, "shape": shape, "go": key, "go_unit": go_unit or unit, "unit": unit,
             "baseline": baseline, "baseline_value": value, "extra": extra or {}}
        if baseline_go:
            r["baseline_go"] = baseline_go  # the baseline is a kvx figure of the same Go run
        return r

    def log(msg, t0):
        print(f"{msg} ({time.time() - t0:.1f} s)", file=sys.stderr)

    rows = []
    t0 = time.time()
    rows.append(row("device-to-device copy (read+write)", "4 GiB", "BenchmarkCopy", "GB/s", "torch copy_", copy_bandwidth()))
    log("copy", t0)
    for ctx in CTXS:
        for batch in BATCHES:
            t0 = time.time()
            base = sdpa_decode(ctx, batch)
            rows.append(row("GQA decode, paged bf16 KV", f"ctx {ctx // 1024}k, batch {batch}",
                            f"BenchmarkDecodeGQA/ctx={ctx}/batch={batch}", "GB/s", "SDPA, contiguous KV", base))
            log(f"sdpa ctx={ctx} batch={batch}: {base:.0f} GB/s", t0)
    for ctx in CTXS:
        for batch in BATCHES:
            t0 = time.time()
            base = mla_decode(ctx, batch)
            rows.append(row("MLA decode (128 heads, 512+64), paged bf16 latent", f"ctx {ctx // 1024}k, batch {batch}",
                            f"BenchmarkMLADecode/ctx={ctx}/batch={batch}", "GB/s", "torch absorbed MLA, contiguous latent", base,
                            extra={"": "TFLOP/s"}))
            log(f"torch mla ctx={ctx} batch={batch}: {base:.0f} GB/s", t0)
    for ctx in DSA_CTXS:
        for batch in BATCHES:
            key = f"BenchmarkDSA/ctx={ctx}/batch={batch}"
            # The baseline is kvx's dense MLA decode of the same Go run.
            rows.append(row("DSA decode attention (index + top-2048 + sparse MLA)", f"ctx {ctx // 1024}k, batch {batch}",
                            key, "µs", "kvx dense MLA decode", None, go_unit="dsa-us", baseline_go="dense-us",
                            extra={"index": "index-us", "top-k": "topk-us", "sparse MLA": "sparse-us"}))
    for m, n, k in GEMMS:
        t0 = time.time()
        base = gemm_tflops(m, n, k)
        rows.append(row("prefill GEMM, bf16 tensor cores (mma.sync)", f"{m}×{n}×{k}", f"BenchmarkGEMM/{m}x{n}x{k}",
                        "TFLOP/s", "cuBLAS bf16 (torch.matmul)", base))
        log(f"cublas {m}x{n}x{k}: {base:.0f} TFLOP/s", t0)
    rows.append(row("prefill matmul (exact fp32 order)", "", "MatMul", "TFLOP/s", "cuBLAS bf16 (torch.matmul)",
                    gemm_tflops(8192, 4096, 4096)))
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    fill(res, go)
    write(res, args.out)


def write(res, out):
    """Writes res as out/cuda-bench.json and the table out/cuda-bench.md.

    The ratio column is kvx / baseline for rates and baseline / kvx (the
    speed-up) for times. A decode row's "kvx / kvx copy" sets its GB/s (cache
    bytes read) against kvx's own copy bandwidth (read and written) of the
    same run.
    """
    copy = next((r["kvx"] for r in res["rows"] if r["go"] == "BenchmarkCopy"), None)
    with open(f"{out}/cuda-bench.json", "w") as f:
        json.dump(res, f, indent=1)

    def fmt(v, unit):
        if v is None:
            return "not run"
        return f"{v:.0f} {unit}" if unit in ("GB/s", "µs") or v >= 100 else f"{v:.1f} {unit}"

    with open(f"{out}/cuda-bench.md", "w") as f:
        f.write(f"Measured on {res['gpu']} (PyTorch {res['torch']}), kvx and baselines in the same run.\n"
                "Ratio: kvx / baseline for rates, baseline time / kvx time (the speed-up) for times.\n\n")
        f.write("| kernel | shape | kvx | baseline | baseline value | ratio | kvx / kvx copy | also measured |\n"
                "|---|---|---|---|---|---|---|---|\n")
        for r in res["rows"]:
            ratio = ""
            if r["ratio"] is not None:
                ratio = f"{r['ratio']:.2f}×" if r["unit"] == "µs" else f"{100 * r['ratio']:.0f}%"
            vs_copy = ""
            if copy and r["kvx"] and r["unit"] == "GB/s" and r["go"] != "BenchmarkCopy":
                vs_copy = f"{100 * r['kvx'] / copy:.0f}%"
            also = ", ".join(f"{name} {v:.1f} µs" if r["extra"][name].endswith("-us") else f"{v:.0f} {r['extra'][name]}"
                             for name, v in (r.get("extra_values") or {}).items() if v is not None)
            f.write(f"| {r['what']} | {r['shape']} | {fmt(r['kvx'], r['unit'])} | {r['baseline']} | "
                    f"{fmt(r['baseline_value'], r['unit'])} | {ratio} | {vs_copy} | {also} |\n")
    print(open(f"{out}/cuda-bench.md").read())


if __name__ == "__main__":
    main()
