#!/usr/bin/env python3
"""Inference speed: `microllm bench` against transformers on the same GPU, in the same run.

The model is a published config with random weights (default tests/fixtures/configs/qwen2.5-0.5b.json), bf16.
microLLM runs `microllm bench --config CONFIG --device cuda --dtype bf16 ... --json FILE` (apps/microllm/bench.cpp);
transformers builds AutoModelForCausalLM.from_config (torch.manual_seed(--seed), attn_implementation="sdpa",
eval, torch.inference_mode) and runs the same tests:

  ppP          prefill: one forward over [1, P] random ids with use_cache=True and logits_to_keep=1 (the last
               position's logits, as generate() asks for and as microllm's engine computes); tokens/s = P / time
  tgN          decode at batch B: N greedy tokens per sequence from a 1-token random prompt with a KV cache;
               tokens/s = B * N / time. transformers: model.generate(do_sample=False,
               min_new_tokens=max_new_tokens=N, eos_token_id=None), the method of docs/perf/pytorch-baselines.md
               (which used a 128-token prompt; here 1 token, so both sides make N tokens with N forwards);
               --hf-decode loop uses a hand-written loop over a DynamicCache instead (argmax, feed back)
  ppP+tgN      the workload PROMPT:BATCH:NEW (default 2048:2:64) end to end, prefill then decode;
               tokens/s counts the B * N generated tokens (BASELINES.md's "generate B2, prompt 2048, 64 new")

Each test: one untimed warm-up, then --reps timed repetitions (fewer when one takes longer than
--seconds-per-test / --reps; at least 1), CUDA synchronized before and after each; the table shows medians,
min and max, and ratio = microLLM / transformers (> 1: microLLM faster), with the issue's targets.
torch.compile with a static cache is not measured: BASELINES.md found it slower than eager at batch 1 (74 vs
54 tok/s with max-autotune, reduce-overhead crashed), so eager stands as the PyTorch figure.

    python3 benchmarks/inference_vs_transformers.py --microllm build/cuda-release/apps/microllm \\
        [--config tests/fixtures/configs/qwen2.5-0.5b.json] [--reps 3] [--out table.md] [--json results.json]
    python3 benchmarks/inference_vs_transformers.py --dry-run      # no torch, no GPU: made-up figures, the table
"""
import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "tests/fixtures/configs/qwen2.5-0.5b.json"

# The targets by config file stem: (test, batch, kind, value). kind "tok/s": microLLM's median at
# least value; kind "x": microLLM / transformers at least value. The brief lists prefill B1 T2048 >= 2x
# PyTorch with the 1.5B targets; it is a relative target and is checked for both models.
TARGETS = {
    "qwen2.5-0.5b": [("tg128", 1, "tok/s", 1500), ("tg128", 8, "tok/s", 8000), ("pp2048+tg64", 2, "tok/s", 2500),
                     ("pp2048", 1, "x", 2.0)],
    "deepseek-r1-distill-qwen-1.5b": [("tg128", 1, "tok/s", 600), ("pp2048", 1, "x", 2.0)],
}


class Test:
    def __init__(self, kind, batch, prompt, new_tokens):
        self.kind, self.batch, self.prompt, self.new_tokens = kind, batch, prompt, new_tokens
        if kind == "prefill":
            self.name = f"pp{prompt}"
        elif kind == "decode":
            self.name = f"tg{new_tokens}"
        else:
            self.name = f"pp{prompt}+tg{new_tokens}"

    @property
    def key(self):
        return (self.name, self.batch)

    @property
    def tokens(self):
        """Counted tokens per repetition: prompt tokens for a prefill, generated ones otherwise."""
        return self.batch * (self.prompt if self.kind == "prefill" else self.new_tokens)


def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()]


def make_tests(args):
    tests = [Test("prefill", 1, p, 0) for p in args.prefill]
    tests += [Test("decode", b, 0, args.new_tokens) for b in args.decode_batches]
    if args.workload and args.workload != "none":
        prompt, batch, new = (int(x) for x in args.workload.split(":"))
        tests.append(Test("workload", batch, prompt, new))
    return tests


def summary(rates):
    """min / median / max of a list of tokens/s (None when empty)."""
    if not rates:
        return None
    return {"min": min(rates), "median": statistics.median(rates), "max": max(rates), "reps": len(rates)}


# ---- microLLM: `microllm bench --json` ----

def microllm_command(args, tests, json_path):
    prefill = sorted({t.prompt for t in tests if t.kind == "prefill"})
    batches = [t.batch for t in tests if t.kind == "decode"]
    workloads = [f"{t.prompt}:{t.batch}:{t.new_tokens}" for t in tests if t.kind == "workload"]
    return [args.microllm, "bench", "--config", args.config, "--device", args.device, "--dtype", args.dtype,
            "-p", ",".join(map(str, prefill)) or "0", "--prefill-batch", "1",
            "-n", str(args.new_tokens) if batches else "0", "-b", ",".join(map(str, batches or [1])),
            "--workload", ",".join(workloads) or "none", "-r", str(args.reps), "--warmup", "1",
            "--seed", str(args.seed), "--json", str(json_path)]


def parse_microllm_json(report):
    """{(test, batch): summary} from `microllm bench --json`, plus its command and GPU."""
    results = {}
    for row in report.get("rows", []):
        rates = row.get("tokens_per_second") or []
        s = summary(rates) or {"min": row["tokens_per_second_min"], "median": row["tokens_per_second_median"],
                               "max": row["tokens_per_second_max"], "reps": 0}
        # Trust the binary's own median (the same definition as statistics.median).
        s["median"] = row.get("tokens_per_second_median", s["median"])
        results[(row["test"], int(row["batch"]))] = s
    info = {"command": report.get("command", ""), "gpu": report.get("machine", {}).get("gpu", ""),
            "skipped": report.get("skipped", [])}
    return results, info


def run_microllm_once(args, tests, deadline):
    """One `microllm bench` over `tests`; returns (results, info, error)."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="infer-bench-"))
    json_path = work / "microllm.json"
    command = microllm_command(args, tests, json_path)
    print("$", shlex.join(command), file=sys.stderr, flush=True)
    info = {"command": shlex.join(command)}
    timeout = max(deadline - time.monotonic(), 10.0)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        if proc.returncode != 0:
            return {}, info, (f"microllm bench exited with {proc.returncode}: "
                              f"{(proc.stderr.strip() or proc.stdout.strip())[-1500:]}")
        with open(json_path) as f:
            results, parsed = parse_microllm_json(json.load(f))
        info.update(parsed, command=shlex.join(command))
        return results, info, None
    except subprocess.TimeoutExpired:
        return {}, info, f"microllm bench did not finish in {timeout:.0f} s (--microllm-timeout)"
    except (OSError, ValueError, KeyError) as e:
        return {}, info, f"microllm bench: {type(e).__name__}: {e}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_microllm(args, tests):
    """microllm bench once per kind of test (prefill, decode, workload), so that one that fails or runs out of
    time (--microllm-timeout for all of them) costs only its rows; returns (results, info, error)."""
    if args.microllm_json:
        with open(args.microllm_json) as f:
            results, info = parse_microllm_json(json.load(f))
        info["command"] = f"(read from {args.microllm_json}) {info['command']}"
        return results, info, None
    if not args.microllm:
        return {}, {"command": ""}, "no --microllm given"
    deadline = time.monotonic() + args.microllm_timeout
    results, info, commands, errors = {}, {"skipped": []}, [], []
    for kind in ("prefill", "decode", "workload"):
        group = [t for t in tests if t.kind == kind]
        if not group:
            continue
        try:
            r, i, e = run_microllm_once(args, group, deadline)
        except KeyboardInterrupt:
            errors.append(f"{kind}: interrupted (SIGINT or SIGTERM)")
            break
        results.update(r)
        commands.append(i.get("command", ""))
        info["gpu"] = info.get("gpu") or i.get("gpu", "")
        info["skipped"] += i.get("skipped", [])
        if e:
            errors.append(f"{kind}: {' / '.join(e.splitlines())}")
    info["command"] = " ; ".join(commands)
    return results, info, "\n".join(errors) or None


# ---- transformers ----

def build_transformers_model(args):
    import torch
    import transformers
    work = pathlib.Path(tempfile.mkdtemp(prefix="infer-config-"))
    try:
        shutil.copy(args.config, work / "config.json")  # AutoConfig reads a directory in every version
        config = transformers.AutoConfig.from_pretrained(str(work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    with torch.device(args.device):  # random initialization on the GPU: seconds, not a minute on the host
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.to(args.device).eval(), config


def transformers_runner(model, test, args, generator):
    """A closure that runs one repetition of `test` (ids drawn fresh each time) and checks its output."""
    import torch
    vocab = model.config.vocab_size
    device = args.device

    def random_ids(batch, length):
        return torch.randint(0, vocab, (batch, length), generator=generator, dtype=torch.int64).to(device)

    if test.kind == "prefill":
        def run():
            ids = random_ids(test.batch, test.prompt)
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            assert out.logits.shape[1] == 1, tuple(out.logits.shape)
            return seconds
        return run

    prompt = test.prompt if test.kind == "workload" else 1
    if args.hf_decode == "loop" and test.kind == "decode":
        def run():
            ids = random_ids(test.batch, prompt)
            torch.cuda.synchronize()
            start = time.perf_counter()
            cache = None  # the first forward makes a DynamicCache
            for step in range(test.new_tokens):
                out = model(input_ids=ids, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                if step + 1 == test.new_tokens:
                    break
                ids = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            return time.perf_counter() - start
        return run

    def run():
        ids = random_ids(test.batch, prompt)
        mask = torch.ones_like(ids)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=test.new_tokens,
                             min_new_tokens=test.new_tokens, eos_token_id=None, pad_token_id=0, use_cache=True)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        assert out.shape == (test.batch, prompt + test.new_tokens), tuple(out.shape)
        return seconds
    return run


def run_transformers(args, tests):
    """Returns (results {(test, batch): summary}, errors {(test, batch): text}, info, fatal error or None)."""
    results, errors, info = {}, {}, {}
    try:
        import torch
        import transformers
        info.update(torch=torch.__version__, transformers=transformers.__version__, cuda=torch.version.cuda,
                    gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")
        start = time.perf_counter()
        model, _ = build_transformers_model(args)
        with torch.inference_mode():  # CUDA context, cuBLAS, sdpa: before any clock starts
            model(input_ids=torch.zeros((1, 8), dtype=torch.int64, device=args.device))
        torch.cuda.synchronize()
        info["build_seconds"] = time.perf_counter() - start
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - the microLLM side is still reported
        return results, errors, info, f"transformers setup failed: {type(e).__name__}: {e}"
    generator = torch.Generator().manual_seed(args.seed + 1)
    with torch.inference_mode():
        for test in tests:
            label = f"{test.name} batch {test.batch}"
            try:
                run = transformers_runner(model, test, args, generator)
                warm = run()
                reps = max(1, min(args.reps, int(args.seconds_per_test // max(warm, 1e-9))))
                rates = [test.tokens / run() for _ in range(reps)]
                results[test.key] = summary(rates)
                note = f" (reps cut to {reps}: warm-up took {warm:.1f} s)" if reps < args.reps else ""
                print(f"transformers {label}: median {results[test.key]['median']:,.1f} tok/s{note}",
                      file=sys.stderr, flush=True)
            except Exception as e:  # noqa: BLE001 - one failing test (OOM, ...) does not stop the others
                errors[test.key] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"transformers {label}: {errors[test.key]}", file=sys.stderr, flush=True)
            except KeyboardInterrupt:
                errors[test.key] = "interrupted (SIGINT or SIGTERM): this and later tests not measured"
                print(f"transformers {label}: {errors[test.key]}", file=sys.stderr, flush=True)
                break
            torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()
    return results, errors, info, None


# ---- The report ----

def fmt(value, digits=0):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def target_rows(config_stem):
    return {(name, batch): (kind, value) for name, batch, kind, value in TARGETS.get(config_stem, [])}


def judge(target, ours, theirs):
    """('>= 1500 tok/s', 'yes' | 'no' | '?') for one target."""
    kind, value = target
    if kind == "tok/s":
        text = f">= {value:,} tok/s"
        return text, "?" if ours is None else ("yes" if ours >= value else "no")
    text = f">= {value:g}x transformers"
    if ours is None or not theirs:
        return text, "?"
    return text, "yes" if ours / theirs >= value else "no"


def render(args, tests, ours, ours_info, ours_error, theirs, theirs_errors, theirs_info, theirs_error):
    stem = pathlib.Path(args.config).stem
    targets = target_rows(stem)
    command = shlex.join(["python3"] + sys.argv)
    gpu = theirs_info.get("gpu") or ours_info.get("gpu") or "unknown GPU"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = (f"torch {theirs_info.get('torch', '?')}, transformers {theirs_info.get('transformers', '?')}, "
                f"CUDA {theirs_info.get('cuda', '?')}, Python {platform.python_version()}")
    lines = [
        f"# Inference, microLLM vs transformers: {stem} ({now})", "",
        f"Command: `{command}`",
        f"microLLM ran: `{ours_info.get('command') or '-'}`",
        f"Machine: {gpu}; {platform.node()}; {versions}"
        + (f"; microllm bench saw {ours_info['gpu']}" if ours_info.get("gpu") else ""),
        f"Model: {args.config}, random weights (seed {args.seed}), {args.dtype}, {args.device}. transformers: "
        f"from_config, sdpa, eval, inference_mode, eager; decode with "
        + ("model.generate(do_sample=False, min_new_tokens=max_new_tokens)" if args.hf_decode == "generate"
           else "a hand-written loop over a DynamicCache")
        + " from a 1-token prompt.",
        f"tokens/s: median of up to {args.reps} timed repetitions after a warm-up (min-max beside it); "
        "ppP = P prompt tokens / time; tgN and ppP+tgN = batch x N generated tokens / time. "
        "ratio = microLLM / transformers (> 1: microLLM faster).", "",
        "| test | batch | microLLM tok/s | transformers tok/s | ratio | target | met | microLLM min-max | "
        "transformers min-max |",
        "|---|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    verdicts = []
    for test in tests:
        o, t = ours.get(test.key), theirs.get(test.key)
        om, tm = (o or {}).get("median"), (t or {}).get("median")
        ratio = om / tm if om is not None and tm else None
        target, met = ("", "")
        if test.key in targets:
            target, met = judge(targets[test.key], om, tm)
            verdicts.append((test, target, met))
        o_range = f"{fmt(o['min'])}-{fmt(o['max'])}" if o else "-"
        t_range = "-"
        if t:
            t_range = f"{fmt(t['min'])}-{fmt(t['max'])} ({t['reps']} rep{'s' if t['reps'] != 1 else ''})"
        lines.append(f"| {test.name} | {test.batch} | {fmt(om)} | {fmt(tm)} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'} | {target} | {met} | {o_range} | {t_range} |")
    lines.append("")
    if verdicts:
        met_count = sum(1 for _, _, m in verdicts if m == "yes")
        lines.append(f"Targets met: {met_count} of {len(verdicts)}"
                     + "".join(f"; {v[0].name} B{v[0].batch} {v[1]}: {v[2]}" for v in verdicts) + ".")
    for error in (ours_error or "").splitlines():
        lines.append(f"microLLM error: {error}")
    for skipped in ours_info.get("skipped", []) or []:
        lines.append(f"microLLM skipped {skipped.get('test')} batch {skipped.get('batch')}: {skipped.get('reason')}")
    if theirs_error:
        lines.append(f"transformers error: {theirs_error}")
    for key, text in theirs_errors.items():
        lines.append(f"transformers {key[0]} batch {key[1]}: {text}")
    return "\n".join(lines).rstrip() + "\n", verdicts


def dry_run_figures(tests):
    """Made-up figures for --dry-run: a `microllm bench --json` report and transformers summaries."""
    rows = []
    for i, test in enumerate(tests):
        base = 1000.0 * (i + 1)
        rates = [base * 0.98, base, base * 1.01]
        rows.append({"test": test.name, "kind": test.kind, "batch": test.batch, "prompt": test.prompt,
                     "new_tokens": test.new_tokens, "tokens": test.tokens, "seconds": [test.tokens / r for r in rates],
                     "tokens_per_second": rates, "tokens_per_second_min": min(rates),
                     "tokens_per_second_median": statistics.median(rates), "tokens_per_second_max": max(rates)})
    report = {"command": "microllm bench (dry run)", "machine": {"gpu": "dry run, no GPU"}, "rows": rows,
              "skipped": []}
    theirs = {t.key: summary([100.0 * (i + 1), 110.0 * (i + 1)]) for i, t in enumerate(tests)}
    return report, theirs


def self_check():
    """The table's arithmetic on fixed figures (run by --dry-run)."""
    assert judge(("tok/s", 1500), 1600.0, 50.0) == (">= 1,500 tok/s", "yes")
    assert judge(("tok/s", 1500), 1400.0, None) == (">= 1,500 tok/s", "no")
    assert judge(("tok/s", 1500), None, 50.0)[1] == "?"
    assert judge(("x", 2.0), 200.0, 100.0) == (">= 2x transformers", "yes")
    assert judge(("x", 2.0), 199.0, 100.0)[1] == "no"
    assert judge(("x", 2.0), 199.0, None)[1] == "?"
    assert summary([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0, "reps": 3}
    report = {"command": "c", "machine": {"gpu": "g"}, "rows": [
        {"test": "tg128", "batch": 8, "tokens_per_second": [1.0, 5.0, 3.0, 4.0], "tokens_per_second_min": 1.0,
         "tokens_per_second_median": 3.5, "tokens_per_second_max": 5.0}]}
    results, info = parse_microllm_json(report)
    assert results[("tg128", 8)] == {"min": 1.0, "median": 3.5, "max": 5.0, "reps": 4} and info["gpu"] == "g"
    assert Test("workload", 2, 2048, 64).tokens == 128 and Test("prefill", 1, 512, 0).tokens == 512


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--microllm", help="the microllm executable (build/cuda-release/apps/microllm)")
    parser.add_argument("--microllm-json", help="read an existing `microllm bench --json` file instead of running it")
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help=f"a Hugging Face config.json (default {DEFAULT_CONFIG})")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per test after one warm-up")
    parser.add_argument("--seconds-per-test", type=float, default=30.0,
                        help="transformers: fewer repetitions when one takes longer than this / --reps")
    parser.add_argument("--prefill", type=int_list, default=[512, 2048], help="prefill prompt lengths at batch 1")
    parser.add_argument("--decode-batches", type=int_list, default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=128, help="decode tests: tokens per sequence")
    parser.add_argument("--workload", default="2048:2:64", help="PROMPT:BATCH:NEW_TOKENS end to end (none: off)")
    parser.add_argument("--hf-decode", choices=["generate", "loop"], default="generate",
                        help="transformers decode: model.generate (default, as BASELINES.md) or a manual loop")
    parser.add_argument("--microllm-timeout", type=float, default=300.0,
                        help="seconds for the microllm bench runs together (one per kind of test)")
    parser.add_argument("--skip-transformers", action="store_true", help="only microllm bench")
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--json", help="also write every figure as JSON to this file")
    parser.add_argument("--dry-run", action="store_true",
                        help="no torch and no GPU: made-up figures (or --microllm-json's) through the same table")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    if not os.path.exists(args.config):
        parser.error(f"--config {args.config}: no such file")
    tests = make_tests(args)
    # SIGTERM (`timeout`) ends the measurements as Ctrl-C does; what was measured is still printed and written.
    signal.signal(signal.SIGTERM, interrupted)

    theirs, theirs_errors, theirs_info, theirs_error = {}, {}, {}, None
    if args.dry_run:
        self_check()
        report, theirs = dry_run_figures(tests)
        if args.microllm_json:
            ours, ours_info, ours_error = run_microllm(args, tests)
        else:
            ours, ours_info = parse_microllm_json(report)
            ours_error = None
        theirs_info = {"torch": "(dry run)", "transformers": "(dry run)", "cuda": "-", "gpu": "dry run, no GPU"}
    else:
        ours, ours_info, ours_error = run_microllm(args, tests)  # first: its process frees the GPU when done
        if ours_error:
            print(f"microLLM error: {ours_error}", file=sys.stderr, flush=True)
        if args.skip_transformers:
            theirs_info = {"gpu": ours_info.get("gpu", "")}
        else:
            theirs, theirs_errors, theirs_info, theirs_error = run_transformers(args, tests)

    text, verdicts = render(args, tests, ours, ours_info, ours_error, theirs, theirs_errors, theirs_info,
                            theirs_error)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        def rows(results):
            return [{"test": k[0], "batch": k[1], **v} for k, v in results.items()]
        with open(args.json, "w") as f:
            json.dump({"command": shlex.join(["python3"] + sys.argv), "config": args.config,
                       "microllm": {"info": ours_info, "error": ours_error, "rows": rows(ours)},
                       "transformers": {"info": theirs_info, "error": theirs_error,
                                        "test_errors": {f"{k[0]} B{k[1]}": v for k, v in theirs_errors.items()},
                                        "rows": rows(theirs)},
                       "targets": [{"test": t.name, "batch": t.batch, "target": target, "met": met}
                                   for t, target, met in verdicts]}, f, indent=2)
    # Exit 1 when a side failed entirely (the table is printed either way); unmet targets are not errors.
    return 1 if (ours_error or theirs_error) and not args.dry_run else 0


if __name__ == "__main__":
    sys.exit(main())
