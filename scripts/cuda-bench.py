#!/usr/bin/env python3
"""cuda-bench.py: the cuda device's kernels against PyTorch on the same GPU, in one run.

Usage (on the GPU machine, from .gpu/run.sh's bench step):
    python3 cuda-bench.py --go-bench go-bench.txt --out DIR

It measures the baselines with PyTorch (scaled_dot_product_attention on
contiguous bf16 KV of the same shapes, the device-to-device copy bandwidth, a
bf16 GEMM through cuBLAS), reads the Go benchmark lines of the cuda test
binary (BenchmarkDecodeGQA, BenchmarkCopy, BenchmarkMatMul: their GB/s and
TFLOP/s metrics), and writes DIR/cuda-bench.json and DIR/cuda-bench.md: one
table, every kvx figure next to its baseline and the ratio.
"""
import argparse
import json
import re
import sys
import time

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
CTXS = [4 << 10, 32 << 10, 128 << 10]
BATCHES = [1, 16, 64]


def timed(fn, iters):
    import torch

    fn()
    torch.cuda.synchronize()
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


def copy_bandwidth():
    import torch

    n = 4 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 20)
    return 2 * n / t / 1e9


def gemm_tflops(m, n, k):
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: a @ b.T, 20)
    return 2 * m * n * k / t / 1e12


LINE = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+.*$")
METRIC = re.compile(r"([0-9.e+]+) (GB/s|TFLOP/s)")


def go_results(path):
    out = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            for val, unit in METRIC.findall(line):
                out[m.group(1)] = (float(val), unit)
    return out


def rewrite(path, go_bench, out):
    """Re-derives the kvx figures of a saved run from its Go benchmark lines
    (the baselines stay as measured) and writes the table again."""
    res = json.load(open(path))
    go = go_results(go_bench)
    best = max((int(m.group(1)), v) for k, (v, u) in go.items() if (m := re.match(r"BenchmarkMatMul/(\d+)x", k)) and u == "TFLOP/s")
    for r in res["rows"]:
        if r["what"].startswith("prefill matmul"):
            r["kvx"] = best[1]
            r["shape"] = f"kvx {best[0]}×4096×4096, cuBLAS 8192×4096×4096"
        if r["kvx"] is not None and r["baseline_value"]:
            r["ratio"] = r["kvx"] / r["baseline_value"]
    write(res, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--go-bench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rewrite", metavar="JSON", help="rewrite the table from an earlier run's cuda-bench.json and its --go-bench lines (no GPU)")
    args = ap.parse_args()
    if args.rewrite:
        rewrite(args.rewrite, args.go_bench, args.out)
        return
    import torch

    gpu = torch.cuda.get_device_name(0)
    go = go_results(args.go_bench)
    rows = []
    copy_torch = copy_bandwidth()
    copy_go = go.get("BenchmarkCopy", (None,))[0]
    rows.append(("device-to-device copy (read+write)", "4 GiB", copy_go, "GB/s", "torch copy_", copy_torch))
    for ctx in CTXS:
        for batch in BATCHES:
            t0 = time.time()
            base = sdpa_decode(ctx, batch)
            kvx = go.get(f"BenchmarkDecodeGQA/ctx={ctx}/batch={batch}", (None,))[0]
            rows.append(("GQA decode, paged bf16 KV", f"ctx {ctx // 1024}k, batch {batch}", kvx, "GB/s", "SDPA, contiguous KV", base))
            print(f"sdpa ctx={ctx} batch={batch}: {base:.0f} GB/s ({time.time() - t0:.1f} s)", file=sys.stderr)
    for name, (m, n, k) in {"MatMul": (8192, 4096, 4096)}.items():
        base = gemm_tflops(m, n, k)
        # the Go benchmark's prefill-shaped case (most rows)
        kvx, rows_seen = None, 0
        for key, (val, unit) in go.items():
            mm = re.match(r"BenchmarkMatMul/(\d+)x", key)
            if mm and unit == "TFLOP/s" and int(mm.group(1)) > rows_seen:
                kvx, rows_seen = val, int(mm.group(1))
        rows.append(("prefill matmul (exact fp32 order)", f"kvx {rows_seen}×4096×4096, cuBLAS {m}×{n}×{k}", kvx, "TFLOP/s", "cuBLAS bf16 (torch)", base))
    res = {"gpu": gpu, "torch": torch.__version__, "rows": [
        {"what": w, "shape": s, "kvx": v, "unit": u, "baseline": bn, "baseline_value": bv,
         "ratio": (v / bv if v and bv else None)} for w, s, v, u, bn, bv in rows]}
    write(res, args.out)


def write(res, out):
    """Writes res as out/cuda-bench.json and the table out/cuda-bench.md.

    A decode row's last column sets its GB/s (K and V read) against kvx's
    own copy bandwidth (read and written) of the same run.
    """
    copy = next((r["kvx"] for r in res["rows"] if r["what"].startswith("device-to-device")), None)
    with open(f"{out}/cuda-bench.json", "w") as f:
        json.dump(res, f, indent=1)
    with open(f"{out}/cuda-bench.md", "w") as f:
        f.write(f"Measured on {res['gpu']} (PyTorch {res['torch']}), kvx and baselines in the same run.\n\n")
        f.write("| kernel | shape | kvx | baseline | baseline value | kvx / baseline | kvx / kvx copy |\n|---|---|---|---|---|---|---|\n")
        for r in res["rows"]:
            fmt = (lambda v: f"{v:.0f} {r['unit']}") if r["unit"] == "GB/s" else (lambda v: f"{v:.1f} {r['unit']}")
            kv = "not run" if r["kvx"] is None else fmt(r["kvx"])
            ratio = "" if r["ratio"] is None else f"{100 * r['ratio']:.0f}%"
            vs_copy = f"{100 * r['kvx'] / copy:.0f}%" if copy and r["kvx"] and r["what"].startswith("GQA decode") else ""
            f.write(f"| {r['what']} | {r['shape']} | {kv} | {r['baseline']} | {fmt(r['baseline_value'])} | {ratio} | {vs_copy} |\n")
    print(open(f"{out}/cuda-bench.md").read())


if __name__ == "__main__":
    main()
