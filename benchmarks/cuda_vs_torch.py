#!/usr/bin/env python3
"""microLLM CUDA ops against PyTorch, measured in the same run on the same GPU.

Runs build/<preset>/benchmarks/cuda_ops_bench (JSON lines), times the PyTorch equivalent of every line
at the same shapes (CUDA events, warm-up, median), and prints a markdown table with the achieved
GB/s and TFLOP/s and the speed ratio (torch time / microLLM time: above 1 means microLLM is faster).

    python3 benchmarks/cuda_vs_torch.py --bench build/cuda-release/benchmarks/cuda_ops_bench [--out table.md]
                                        [--filter SUBSTRING]   (only the rows cuda_ops_bench --filter selects)
"""
import argparse
import datetime
import json
import platform
import subprocess
import sys

import torch
import torch.nn.functional as F

MODELS = {
    "qwen2.5-0.5b": dict(hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64, vocab=151936),
    "deepseek-r1-distill-qwen-1.5b": dict(hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128,
                                          vocab=151936),
}
DEV = "cuda"
BF16 = torch.bfloat16


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def rand(*shape, dtype=BF16, lo=-1.0, hi=1.0):
    return torch.empty(*shape, device=DEV, dtype=torch.float32).uniform_(lo, hi).to(dtype)


def rope_apply(q, cos, sin):
    half = q.shape[-1] // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return q * cos + rotated * sin


def sdpa(q, k, v, causal):
    """The fastest sdpa torch offers here: flash with GQA, else flash on repeated kv heads."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except RuntimeError:
            group = q.shape[1] // k.shape[1]
            return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                                  is_causal=causal)


def torch_fn(line):
    """A closure that runs the PyTorch equivalent of one microLLM measurement."""
    op, model, t = line["op"], line["model"], line["tokens"]
    if model == "bandwidth":
        rows, cols = 16384, 4096
        a, b = rand(rows, cols), rand(rows, cols)
        if op == "copy":
            dst = torch.empty_like(a)
            return lambda: dst.copy_(a)
        if op == "add":
            return lambda: a + b
        if op == "silu":
            return lambda: F.silu(a)
        if op == "swiglu":
            return lambda: F.silu(a) * b
        if op == "rms_norm":
            w = rand(cols, lo=0.5, hi=1.5)
            return lambda: F.rms_norm(a, (cols,), w, 1e-6)
        if op == "softmax":
            return lambda: torch.softmax(a, -1)
        if op == "cast_f32_bf16":
            f = rand(rows, cols, dtype=torch.float32)
            return lambda: f.to(BF16)
        if op == "cross_entropy_fwd":
            logits = rand(8192, 151936, lo=-4, hi=4)
            targets = torch.arange(0, 8192 * 11, 11, device=DEV) % 151936
            return lambda: F.cross_entropy(logits, targets)
    m = MODELS[model]
    h, inter, nh, nkv, d, vocab = (m[k] for k in ("hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"))
    if op == "rms_norm_residual":
        x, r, w = rand(t, h), rand(t, h), rand(h, lo=0.5, hi=1.5)
        return lambda: F.rms_norm(x + r, (h,), w, 1e-6)
    if op == "rope":
        q = rand(1, t, nh, d).transpose(1, 2)
        inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=DEV).float() / d))
        freqs = torch.outer(torch.arange(t, device=DEV).float(), inv)
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos().to(BF16)[None, None], emb.sin().to(BF16)[None, None]
        return lambda: rope_apply(q, cos, sin)
    if op == "swiglu":
        g, u = rand(t, inter), rand(t, inter)
        return lambda: F.silu(g) * u
    if op in ("norm_gate_up_swiglu", "norm_gate_up_swiglu_unfused"):  # Hugging Face's MLP input half, eager
        x, r, g = rand(t, h), rand(t, h), rand(h, lo=0.5, hi=1.5)
        w = rand(2 * inter, h, lo=-0.05, hi=0.05)

        def mlp_in():
            y = F.linear(F.rms_norm(x + r, (h,), g, 1e-6), w)
            return F.silu(y[:, :inter]) * y[:, inter:]
        return mlp_in
    if op.startswith("gemm_"):
        qkv = (nh + 2 * nkv) * d
        n, k = {"gemm_qkv": (qkv, h), "gemm_o": (h, nh * d), "gemm_gate_up": (2 * inter, h),
                "gemm_down": (h, inter), "gemm_lm_head": (vocab, h)}[op]
        a, w = rand(t, k), rand(n, k, lo=-0.05, hi=0.05)
        return lambda: F.linear(a, w)
    if op == "cross_entropy_fwd_bwd":
        logits = rand(t, vocab, lo=-4, hi=4).requires_grad_()
        targets = torch.arange(0, t * 37, 37, device=DEV) % vocab

        def run():
            logits.grad = None
            F.cross_entropy(logits, targets).backward()
        return run
    if op in ("attention_fwd", "attention_fwd_mma", "attention_bwd"):
        b = int(line["shape"].split()[0][1:])  # "B8 T1024 ..."
        q = rand(b, t, nh, d).transpose(1, 2).requires_grad_()
        k = rand(b, t, nkv, d).transpose(1, 2).requires_grad_()
        v = rand(b, t, nkv, d).transpose(1, 2).requires_grad_()
        if op != "attention_bwd":
            return lambda: sdpa(q, k, v, True)
        out = sdpa(q, k, v, True)
        do = rand(b, t, nh, d).transpose(1, 2)
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    if op == "attention_decode":
        q, k, v = rand(8, nh, 1, d), rand(8, nkv, 2048, d), rand(8, nkv, 2048, d)
        return lambda: sdpa(q, k, v, False)
    if op == "paged_attention_decode":  # torch has no paged cache: the contiguous decode of the same batch
        b = int(line["shape"].split()[0][1:])  # "B8 ctx2048 ..."
        q, k, v = rand(b, nh, 1, d), rand(b, nkv, 2048, d), rand(b, nkv, 2048, d)
        return lambda: sdpa(q, k, v, False)
    raise KeyError(op)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", required=True, help="path to the cuda_ops_bench program")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", help="also write the table to this markdown file")
    parser.add_argument("--filter", help="only the rows whose 'op model' contains this (cuda_ops_bench --filter)")
    args = parser.parse_args()

    command = [args.bench, "--reps", str(args.reps)] + (["--filter", args.filter] if args.filter else [])
    result = subprocess.run(command, capture_output=True, text=True)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        sys.exit(f"cuda_ops_bench failed with status {result.returncode}")
    lines = [json.loads(l) for l in result.stdout.splitlines() if l.startswith("{")]

    copy_gbs = None
    rows = []
    for line in lines:
        try:
            torch_ms = median_ms(torch_fn(line), args.reps)
        except Exception as error:  # an op torch cannot run here: say so in the table
            torch_ms = float("nan")
            print(f"torch {line['op']}: {error}", file=sys.stderr)
        gbs = line["bytes"] / line["ms"] / 1e6 if line["bytes"] else 0.0
        tflops = line["flops"] / line["ms"] / 1e9 if line["flops"] else 0.0
        if line["op"] == "copy":
            copy_gbs = gbs
        rows.append((line, torch_ms, gbs, tflops))
        torch.cuda.empty_cache()

    gpu = torch.cuda.get_device_name()
    header = [
        f"# microLLM CUDA ops vs PyTorch ({datetime.date.today().isoformat()})",
        "",
        f"Command: `python3 benchmarks/cuda_vs_torch.py --bench {args.bench} --reps {args.reps}"
        + (f" --filter '{args.filter}'" if args.filter else "") + "`",
        f"Machine: {gpu}, torch {torch.__version__}, CUDA {torch.version.cuda}, {platform.node()}",
        "Times are medians of CUDA-event timings after warm-up; ratio = torch ms / microLLM ms (> 1: microLLM faster);",
        "% copy = achieved bytes/s over the device-to-device copy bandwidth measured in this run.",
        "",
        "| op | model | T | shape | microLLM ms | torch ms | ratio | GB/s | % copy | TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    table = []
    for line, torch_ms, gbs, tflops in rows:
        ratio = torch_ms / line["ms"] if line["ms"] > 0 else float("nan")
        pct = f"{100 * gbs / copy_gbs:.0f}%" if copy_gbs and gbs else ""
        table.append(f"| {line['op']} | {line['model']} | {line['tokens']} | {line['shape']} | {line['ms']:.4f} | "
                     f"{torch_ms:.4f} | {ratio:.2f} | {gbs:.0f} | {pct} | {tflops:.1f} |")
    text = "\n".join(header + table) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
