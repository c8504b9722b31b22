#!/usr/bin/env python3
"""A Hugging Face model directory with random weights, for `microllm serve` where no checkpoint can be fetched
(the GPU machine has no network). transformers builds AutoModelForCausalLM.from_config(CONFIG) with
torch.manual_seed(--seed) and save_pretrained writes config.json, model.safetensors and
generation_config.json in --dtype (bf16); the tokenizer files of --tokenizer DIR (tokenizer.json,
tokenizer_config.json and, when present, chat_template.jinja) are copied beside them. Without a tokenizer
the directory still serves /v1/completions (microllm falls back to bytes as ids).

    python3 tools/gpu/random_model_dir.py --config tests/fixtures/configs/qwen2.5-0.5b.json \\
        --tokenizer data/tokenizers/qwen3 --out /tmp/serve-qwen2.5-0.5b

Qwen3's tokenizer (data/tokenizers/qwen3, from .device/tokenizers.tar.xz) has Qwen2.5's base vocabulary and
special tokens (<|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645), so it fits the Qwen2.5 and
DeepSeek-R1-Distill-Qwen configs (vocab_size 151936).
"""
import argparse
import json
import pathlib
import shutil
import sys
import tempfile
import time

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


def tokenizer_size(path):
    """1 + the largest id of tokenizer.json (vocabulary and added tokens)."""
    data = json.loads(path.read_text())
    vocab = data.get("model", {}).get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else []  # BPE; Unigram's is a list of pairs
    if isinstance(vocab, list):
        ids = list(range(len(vocab)))
    ids += [t["id"] for t in data.get("added_tokens", [])]
    return 1 + max(ids) if ids else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a Hugging Face config.json")
    parser.add_argument("--out", required=True, help="the model directory to write (replaced)")
    parser.add_argument("--tokenizer", help="a directory with tokenizer.json + tokenizer_config.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    parser.add_argument("--device", default="cuda", help="where the random initialization runs")
    args = parser.parse_args()

    import torch
    import transformers

    start = time.time()
    out = pathlib.Path(args.out)
    work = pathlib.Path(tempfile.mkdtemp(prefix="random-model-config-"))
    try:
        shutil.copy(args.config, work / "config.json")
        config = transformers.AutoConfig.from_pretrained(str(work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(args.seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(args.seed)
    device = args.device if (args.device != "cuda" or torch.cuda.is_available()) else "cpu"
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(str(out))
    del model

    if args.tokenizer:
        tok = pathlib.Path(args.tokenizer)
        if not (tok / "tokenizer.json").is_file():
            sys.exit(f"{tok}/tokenizer.json: no such file")
        for name in TOKENIZER_FILES:
            if (tok / name).is_file():
                shutil.copy(tok / name, out / name)
        size = tokenizer_size(out / "tokenizer.json")
        if size > config.vocab_size:
            sys.exit(f"the tokenizer has ids up to {size - 1}, the config's vocab_size is {config.vocab_size}")
        print(f"tokenizer from {tok}: ids 0..{size - 1} (vocab_size {config.vocab_size})")
    else:
        print("no --tokenizer: the directory serves /v1/completions with bytes as ids")
    files = ", ".join(f"{p.name} ({p.stat().st_size / 1e6:.1f} MB)" for p in sorted(out.iterdir()))
    print(f"{out}: {params / 1e6:.1f} M parameters, {args.dtype}, seed {args.seed}, in {time.time() - start:.1f} s: "
          f"{files}")


if __name__ == "__main__":
    main()
