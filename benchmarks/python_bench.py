#!/usr/bin/env python3
"""microLLM from Python against its own command line and against PyTorch, measured in one run (the GPU machine):

  generate   Qwen2.5-0.5B (random weights, bf16, CUDA), 128 greedy tokens at batch 1: microllm.Model.generate from
             Python against `microllm generate -v` (the same folder, its tokens/s line), each best of --runs.
  train      a transformers Qwen2 model (the Qwen2.5-0.5B config, bf16, batch x tokens) forward + backward + loss:
             PyTorch's sdpa attention and RMSNorm against microllm.torch's attention and RMSNorm, ms a step.

    PYTHONPATH=<the package> python3 benchmarks/python_bench.py --microllm .device/bin/microllm \\
        --config tests/fixtures/configs/qwen2.5-0.5b.json --tokenizer data/tokenizers/qwen3 [--out result.md]

Prints the command, the machine and each comparison as a ratio (and writes them to --out).
"""
import argparse
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import transformers

import microllm
import microllm.torch


def random_folder(config_path, tokenizer_dir, work):
    """A transformers save_pretrained folder of the config with random weights (bf16) and a tokenizer."""
    shutil.copy(config_path, work / "config.json")
    config = transformers.AutoConfig.from_pretrained(str(work))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(str(work))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pathlib.Path(tokenizer_dir) / name, work / name)
    return config


def bench_generate(args, folder):
    tokens = 128
    cli = [args.microllm, "generate", "--model", str(folder), "--device", "cuda", "--dtype", "bf16", "-p", "Hello",
           "-n", str(tokens), "--temperature", "0", "--no-echo", "-v"]
    cli_rates = []
    for _ in range(args.runs):
        out = subprocess.run(cli, capture_output=True, text=True, timeout=300)
        match = re.search(r"([0-9.]+) tokens/s", out.stderr)
        if out.returncode != 0 or not match:
            raise RuntimeError(f"{' '.join(cli)} failed:\n{out.stderr[-2000:]}")
        cli_rates.append(float(match.group(1)))
    model = microllm.load_model(str(folder), device="cuda", dtype="bf16")
    python_rates = []
    for _ in range(args.runs + 1):  # the first warms up
        start = time.perf_counter()
        result = model.generate("Hello", max_tokens=tokens, temperature=0, details=True)
        seconds = time.perf_counter() - start
        python_rates.append(len(result.token_ids) / seconds)
    cli_best, python_best = max(cli_rates), max(python_rates[1:])
    return [("generate: `microllm generate -v` (tokens/s, whole call)", f"{cli_best:.1f}"),
            ("generate: Model.generate from Python (tokens/s, whole call)", f"{python_best:.1f}"),
            ("generate: Python / CLI", f"{python_best / cli_best:.3f}")]


def bench_train(args, config):
    from transformers.models.qwen2 import modeling_qwen2

    transformers.AttentionInterface.register("microllm", microllm.torch.attention_function)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to("cuda", torch.bfloat16).train()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.tokens), device="cuda")
    original_norm = modeling_qwen2.Qwen2RMSNorm.forward

    def step():
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids.reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)

    def time_steps(attn, rms_norm_forward):
        model.config._attn_implementation = attn
        modeling_qwen2.Qwen2RMSNorm.forward = rms_norm_forward
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / args.steps * 1e3

    results = {}
    for _ in range(2):  # alternated, so both see the same clocks
        results.setdefault("sdpa", []).append(time_steps("sdpa", original_norm))
        results.setdefault("microllm", []).append(time_steps("microllm", microllm.torch.rms_norm_forward))
    modeling_qwen2.Qwen2RMSNorm.forward = original_norm
    sdpa, ours = min(results["sdpa"]), min(results["microllm"])
    shape = f"B{args.batch} x T{args.tokens}"
    return [(f"train step ({shape}, bf16): sdpa + PyTorch RMSNorm (ms)", f"{sdpa:.2f}"),
            (f"train step ({shape}, bf16): microllm.torch attention + RMSNorm (ms)", f"{ours:.2f}"),
            ("train step: sdpa / microllm.torch (above 1: microllm.torch faster)", f"{sdpa / ours:.3f}")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--microllm", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json and tokenizer_config.json")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="python-bench-"))
    config = random_folder(args.config, args.tokenizer, work)
    rows = bench_generate(args, work) + bench_train(args, config)
    lines = [f"command: {' '.join(sys.argv)}",
             f"machine: {platform.node()}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"transformers {transformers.__version__}, microllm {microllm.__version__}",
             "", "| measurement | value |", "| --- | ---: |"] + [f"| {name} | {value} |" for name, value in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
