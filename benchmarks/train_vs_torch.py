#!/usr/bin/env python3
"""Training throughput: microLLM against PyTorch on the same GPU, in the same run.

The model is a published config with random initialization (default: Qwen2.5-0.5B), trained with bf16
mixed precision and fp32 master weights: microLLM's `microllm train --precision bf16-mixed`, and PyTorch's
usual recipe (fp32 parameters, torch.autocast(bf16), fused AdamW, sdpa attention). Reports tokens/s
(steady state), model FLOPs utilization and peak GPU memory, and the ratio.

    python3 benchmarks/train_vs_torch.py --microllm build/cuda-release/apps/microllm \
        --config tests/fixtures/configs/qwen2.5-0.5b.json --data /tmp/kjv [--batch 8 --seq 1024 --steps 30]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch

PEAK_BF16_TFLOPS = 989.4  # H100/H200 SXM dense bf16, the datasheet figure MFU is quoted against


def flops_per_token(config, seq):
    """6N for the weights' forward and backward, plus attention scores (causal: half of 12 L d T)."""
    h, layers, heads = config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads", heads)
    inter, vocab = config["intermediate_size"], config["vocab_size"]
    per_layer = h * (heads + 2 * kv) * head_dim + heads * head_dim * h + 3 * h * inter
    n = layers * per_layer + vocab * h  # the LM head's matmul counts once even when tied
    return 6 * n + 6 * layers * heads * head_dim * seq


def run_microllm(args, config):
    out = f"/tmp/train_bench_{os.getpid()}"
    command = [args.microllm, "train", "--preset", args.config, "--data", args.data, "--device", "cuda",
               "--precision", "bf16-mixed", "--batch-size", str(args.batch), "--seq-len", str(args.seq),
               "--steps", str(args.steps), "--warmup", "5", "--lr", "3e-4", "--eval-interval", "0",
               "--out", out, "--set", "log_interval=5", "--set", "eval_batches=1",
               "--set", f"checkpoint_dir={out}/checkpoint", "--overwrite"]
    print("$", " ".join(command), file=sys.stderr, flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
    if result.returncode != 0:
        sys.exit(f"microllm train failed ({result.returncode})")
    steps = [json.loads(l) for l in open(f"{out}/metrics.jsonl") if '"tokens_per_second"' in l]
    steady = [s["tokens_per_second"] for s in steps[1:]] or [steps[-1]["tokens_per_second"]]
    peak = 0.0
    for line in result.stdout.splitlines():
        if "peak device memory" in line:
            peak = float(line.split("peak device memory")[1].split("GB")[0])
    return sum(steady) / len(steady), peak, " ".join(command)


def run_torch(args, config):
    from transformers import AutoConfig, AutoModelForCausalLM
    hf_config = AutoConfig.from_pretrained(args.config)
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    vocab = config["vocab_size"]
    ids = torch.randint(0, min(vocab, 256), (args.batch, args.seq + 1), device="cuda")
    torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids[:, :-1]).logits
        # As transformers' loss does: the logits upcast to f32.
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    timed = max(args.steps - 5, 5)
    for _ in range(timed):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return timed * args.batch * args.seq / seconds, torch.cuda.max_memory_allocated() / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--microllm", required=True)
    parser.add_argument("--config", required=True, help="an HF config.json")
    parser.add_argument("--data", required=True, help="token file prefix from `microllm prepare`")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args()
    config = json.load(open(args.config))
    fpt = flops_per_token(config, args.seq)

    ours, ours_peak, command = run_microllm(args, config)
    torch.cuda.empty_cache()
    theirs, theirs_peak = run_torch(args, config)

    def mfu(tps):
        return 100 * tps * fpt / (PEAK_BF16_TFLOPS * 1e12)

    lines = [
        f"# Training throughput, microLLM vs PyTorch ({datetime.date.today().isoformat()})", "",
        f"Command: `python3 benchmarks/train_vs_torch.py --microllm {args.microllm} --config {args.config} "
        f"--data {args.data} --batch {args.batch} --seq {args.seq} --steps {args.steps}`",
        f"microLLM ran: `{command}`",
        f"Machine: {torch.cuda.get_device_name()}, torch {torch.__version__}. Model: {args.config}, random init, "
        f"B{args.batch} T{args.seq}, bf16 compute with fp32 master weights and AdamW (PyTorch: autocast + fused "
        f"AdamW + sdpa). MFU against {PEAK_BF16_TFLOPS} TFLOP/s dense bf16, {fpt / 1e9:.2f} GFLOP per token.", "",
        "| trainer | tokens/s | MFU | peak GPU memory (GB) |", "|---|---|---|---|",
        f"| microLLM | {ours:,.0f} | {mfu(ours):.1f}% | {ours_peak:.1f} |",
        f"| PyTorch | {theirs:,.0f} | {mfu(theirs):.1f}% | {theirs_peak:.1f} |",
        f"| ratio (microLLM / PyTorch) | {ours / theirs:.2f}x | | |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        open(args.out, "w").write(text)


if __name__ == "__main__":
    main()
