#!/usr/bin/env python3
"""Full-size parity of microLLM against transformers on random weights (the GPU machine; no network).

    python3 tools/oracle/parity_full.py --microllm .device/bin/microllm --configs tests/fixtures/configs \\
        --out parity.md

For every config in --configs/*.json (published config.json files; models over --max-params, 2e9 by default,
are skipped) it
  1. builds the model with transformers (AutoConfig from the file, AutoModelForCausalLM.from_config after
     torch.manual_seed(--seed): transformers' own random initialization), float32, eager attention, on --device,
  2. computes with transformers: float32 logits of a fixed batch of ids ([--batch, --tokens] from a seeded
     generator), a --greedy-token argmax continuation of the first sequence in float32 (one full forward per
     token, no stop tokens), and the bf16 logits of the same model cast to bfloat16,
  3. saves the float32 model with save_pretrained into a temporary directory (--tmp, default /tmp),
  4. runs `microllm logits --model DIR --ids ... --device ... --dtype f32 --greedy N` and `--dtype bf16`, and
  5. compares: float32 logits within 1e-3 relative error (||ours - theirs|| / ||theirs||); bf16 logits within
     2e-2 of transformers' bf16 logits, or, where transformers' own bf16 error is large (random weights at full
     size give 1.5e-2 to 3e-2), at most 1.5x transformers' bf16 error against the float32 logits; and all greedy
     tokens identical.
With --f64 it also computes transformers' logits in float64 (the same weights, on --device) as the truth both
float32 runs are measured against: a float32 difference past 1e-3 then passes when our float32 logits are at least
as close to the float64 ones as transformers' own float32 logits are (a model whose rounding noise grows past 1e-3
through its depth, where neither float32 run is the reference).
It writes a markdown table (config, parameters, errors, greedy tokens matched, seconds, verdict) to --out
and prints it. Each config runs in its own try block: an error is logged, reported in the table, and the run
goes on. Exit status 1 if any config failed or errored. TF32 is off everywhere (float32 means float32).
"""
import argparse
import gc
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from greedy_reference import greedy, logits_of  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

FP32_TOL = 1e-3
BF16_TOL = 2e-2
BF16_VS_HF = 1.5  # or: our bf16 error against the fp32 logits at most this times transformers' own


def rel_err(ours, theirs):
    ours, theirs = ours.double(), theirs.double()
    return float((ours - theirs).norm() / theirs.norm())


def count_parameters(config):
    """Parameters (tied embeddings once) without allocating: the model on the meta device."""
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        n = sum(p.numel() for p in model.parameters())
        del model
        return n
    except Exception as e:  # noqa: BLE001 - count from the config instead
        print(f"  counting on the meta device failed ({type(e).__name__}: {e}); counting from the config")
    c = config
    heads, kv = c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    attn = c.hidden_size * head_dim * (2 * heads + 2 * kv)
    if c.model_type == "qwen2":
        attn += head_dim * (heads + 2 * kv)  # q/k/v biases
    if c.model_type == "qwen3":
        attn += 2 * head_dim  # q_norm, k_norm
    layer = attn + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size
    embed = c.vocab_size * c.hidden_size
    return c.num_hidden_layers * layer + c.hidden_size + embed * (1 if c.tie_word_embeddings else 2)


def build_model(config, seed, device):
    """transformers' random initialization, float32, on `device` (built there directly when it can be).

    Built in float32, not in the config's dtype and then widened: a buffer made at construction keeps the rounding
    of the dtype it was made in (Gemma 3's embedding scale sqrt(hidden_size) would stay rounded to bfloat16, as
    transformers has it when it loads a checkpoint in bfloat16, not in float32)."""
    for attr in ("dtype", "torch_dtype"):
        if hasattr(config, attr):
            try:
                setattr(config, attr, torch.float32)
            except (AttributeError, TypeError, ValueError):
                pass
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
        try:
            with torch.device(device):
                model = transformers.AutoModelForCausalLM.from_config(config)
            return model.float().to(device).eval()
        except Exception as e:  # noqa: BLE001 - fall back to building on the host
            print(f"  building on {device} failed ({type(e).__name__}: {e}); building on the CPU")
            gc.collect()
            torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return model.float().to(device).eval()


def run_microllm(binary, model_dir, ids, device, dtype, out, greedy_tokens, timeout):
    ids_text = ";".join(",".join(str(int(t)) for t in row) for row in ids.tolist())
    cmd = [binary, "logits", "--model", str(model_dir), "--ids", ids_text, "--device", device, "--dtype", dtype,
           "--out", str(out)]
    if greedy_tokens > 0:
        cmd += ["--greedy", str(greedy_tokens)]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"microllm logits --dtype {dtype} exited with {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    report = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                pass
    tensors = load_file(str(out))
    print(f"  microllm {dtype}: {time.time() - start:.1f} s (load {report.get('load_seconds', 0):.1f} s, "
          f"forward {report.get('forward_seconds', 0):.2f} s, greedy {report.get('greedy_seconds', 0):.2f} s)")
    return tensors


def check_config(path, args, device):
    """One config: returns a row dict for the table."""
    row = {"config": path.stem, "params": None, "fp32": None, "bf16": None, "bf16_truth": None, "hf_bf16": None,
           "greedy": None, "ours_f64": None, "hf_f64": None,
           "margin": None, "seconds": None, "verdict": "ERROR", "note": ""}
    start = time.time()
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"parity-{path.stem}-", dir=args.tmp))
    try:
        config_dir = work / "config"
        config_dir.mkdir()
        shutil.copy(path, config_dir / "config.json")
        config = transformers.AutoConfig.from_pretrained(str(config_dir))
        try:
            config._attn_implementation = "eager"
        except AttributeError:
            pass
        params = count_parameters(config)
        row["params"] = params
        if params > args.max_params:
            row["verdict"], row["note"] = "skipped", f"over {args.max_params:.3g} parameters"
            print(f"  {params / 1e9:.2f}B parameters: skipped")
            return row

        model = build_model(config, args.seed, device)
        vocab = config.vocab_size
        generator = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, vocab, (args.batch, args.tokens), generator=generator, dtype=torch.int64)
        hf_fp32 = logits_of(model, ids.to(device)).cpu()
        hf_tokens, margin = greedy(model, ids[:1].to(device), args.greedy)
        row["margin"] = margin
        model_dir = work / "model"
        model.save_pretrained(str(model_dir))  # float32, safetensors (sharded when large)
        hf_fp64 = None
        if args.f64:
            model = model.double()
            hf_fp64 = logits_of(model, ids.to(device)).cpu()
            row["hf_f64"] = rel_err(hf_fp32, hf_fp64)
        model = model.to(torch.bfloat16)
        hf_bf16 = logits_of(model, ids.to(device)).cpu()
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        row["hf_bf16"] = rel_err(hf_bf16, hf_fp32)
        print(f"  transformers: {time.time() - start:.1f} s (bf16 vs fp32 {row['hf_bf16']:.2e}, "
              f"greedy min top-2 gap {margin:.3g})")

        ours_fp32 = run_microllm(args.microllm, model_dir, ids, args.microllm_device, "f32", work / "ours_f32.safetensors",
                                 args.greedy, args.timeout)
        ours_bf16 = run_microllm(args.microllm, model_dir, ids, args.microllm_device, "bf16",
                                 work / "ours_bf16.safetensors", 0, args.timeout)
        if tuple(ours_fp32["logits"].shape) != tuple(hf_fp32.shape):
            raise RuntimeError(f"logits shape {tuple(ours_fp32['logits'].shape)}, expected {tuple(hf_fp32.shape)}")
        row["fp32"] = rel_err(ours_fp32["logits"], hf_fp32)
        if hf_fp64 is not None:
            row["ours_f64"] = rel_err(ours_fp32["logits"], hf_fp64)
        row["bf16"] = rel_err(ours_bf16["logits"], hf_bf16)
        row["bf16_truth"] = rel_err(ours_bf16["logits"], hf_fp32)
        ours_tokens = ours_fp32.get("greedy_tokens", torch.empty(0, dtype=torch.int64)).to(torch.int64)
        matched = 0
        for a, b in zip(ours_tokens.tolist(), hf_tokens.tolist()):
            if a != b:
                break
            matched += 1
        row["greedy"] = matched
        bf16_ok = row["bf16"] <= BF16_TOL or row["bf16_truth"] <= BF16_VS_HF * row["hf_bf16"]
        fp32_ok = row["fp32"] <= FP32_TOL or (row["ours_f64"] is not None and row["ours_f64"] <= row["hf_f64"])
        ok = fp32_ok and bf16_ok and matched == args.greedy
        row["verdict"] = "pass" if ok else "FAIL"
        if matched != args.greedy:
            row["note"] = f"first difference at token {matched}, HF min top-2 gap {margin:.3g}"
    except Exception as e:  # noqa: BLE001 - log, report, go on
        traceback.print_exc()
        row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        row["seconds"] = time.time() - start
    return row


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def table(rows, args, device):
    lines = [f"Random-weight parity, microLLM vs transformers {transformers.__version__} (torch {torch.__version__}), "
             f"{device_name(device)}; batch [{args.batch}, {args.tokens}], {args.greedy} greedy tokens; "
             f"relative errors ||a-b||/||b||; tolerances: fp32 {FP32_TOL:g}; bf16 {BF16_TOL:g} against transformers' "
             f"bf16, or our bf16 vs fp32 at most {BF16_VS_HF:g}x transformers' bf16 vs fp32.",
             "",
             "| config | params | fp32 rel err | fp32 vs f64: ours | fp32 vs f64: HF | bf16 rel err | "
             "bf16 vs fp32: ours | bf16 vs fp32: HF | greedy match | HF min top-2 gap | seconds | verdict |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        params = "-" if r["params"] is None else f"{r['params'] / 1e6:,.1f}M"
        greedy_cell = "-" if r["greedy"] is None else f"{r['greedy']}/{args.greedy}"
        verdict = r["verdict"] + (f" ({r['note']})" if r["note"] else "")
        lines.append(f"| {r['config']} | {params} | {fmt(r['fp32'], '.2e')} | {fmt(r['ours_f64'], '.2e')} | "
                     f"{fmt(r['hf_f64'], '.2e')} | {fmt(r['bf16'], '.2e')} | "
                     f"{fmt(r['bf16_truth'], '.2e')} | {fmt(r['hf_bf16'], '.2e')} | {greedy_cell} | "
                     f"{fmt(r['margin'], '.3g')} | {fmt(r['seconds'], '.1f')} | "
                     f"{verdict.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--microllm", required=True, help="the microllm binary (a CUDA build for --device cuda)")
    parser.add_argument("--configs", default=str(ROOT / "tests" / "fixtures" / "configs"),
                        help="a folder of config.json files (*.json)")
    parser.add_argument("--out", required=True, help="the markdown table to write")
    parser.add_argument("--device", default="cuda", help="where transformers runs (cuda, cuda:N or cpu)")
    parser.add_argument("--microllm-device", default=None, help="where microllm runs (default: --device)")
    parser.add_argument("--only", action="append", help="run only configs whose file name contains this")
    parser.add_argument("--max-params", type=float, default=2e9)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--greedy", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--timeout", type=float, default=300, help="seconds for each microllm run")
    parser.add_argument("--tmp", default=None, help="where the temporary model directories go (default /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary model directories")
    parser.add_argument("--f64", action="store_true",
                        help="also measure both float32 runs against transformers' float64 logits")
    args = parser.parse_args()
    if not os.access(args.microllm, os.X_OK):
        parser.error(f"--microllm {args.microllm} is not an executable file")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    if args.microllm_device is None:
        args.microllm_device = args.device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    configs = sorted(pathlib.Path(args.configs).glob("*.json"))
    if args.only:
        configs = [c for c in configs if any(o in c.name for o in args.only)]
    if not configs:
        print(f"no *.json configs in {args.configs}", file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {device_name(device)}; "
          f"microllm {args.microllm} on {args.microllm_device}")
    start = time.time()
    rows = []
    for path in configs:
        print(f"{path.name}:", flush=True)
        rows.append(check_config(path, args, device))
        r = rows[-1]
        print(f"  {r['verdict']}: fp32 {fmt(r['fp32'], '.2e')}, bf16 {fmt(r['bf16'], '.2e')} "
              f"(vs fp32: ours {fmt(r['bf16_truth'], '.2e')}, HF {fmt(r['hf_bf16'], '.2e')}), "
              f"greedy {r['greedy']}/{args.greedy}, {r['seconds']:.1f} s {r['note']}", flush=True)
    text = table(rows, args, device) + f"\nTotal {time.time() - start:.0f} s.\n"
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(text)
    print("\n" + text)
    bad = [r["config"] for r in rows if r["verdict"] not in ("pass", "skipped")]
    if bad:
        print(f"failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
