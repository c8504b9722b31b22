#!/usr/bin/env python3
"""Golden files for microLLM's training tests, from PyTorch autograd on transformers' own model classes.

Run where torch and transformers are installed (the GPU machine); no network is used:

    python3 tools/oracle/train_golden.py                 # writes tests/fixtures/train/golden_*.{safetensors,config.json}

For each family it builds a tiny model in float32 with random weights (so norms and biases are not their
trivial initial values) from transformers' classes:
  llama  LlamaForCausalLM   tied embeddings, GQA
  qwen2  Qwen2ForCausalLM   q/k/v biases, untied head
  qwen3  Qwen3ForCausalLM   qk-norm, explicit head_dim (12, not hidden/heads = 8), untied head
then a batch of ids [2, 7] and targets (one of them -100, ignored), the mean cross-entropy of the logits
against the targets (no shift: targets are given), and every parameter's gradient by autograd.

Outputs (tests/fixtures/train/), each well under 1 MB:
  golden_<family>.safetensors   the weights under Hugging Face names (a tied head is stored once, as
                                model.embed_tokens.weight), "ids" and "targets" (int64), "loss" (f32 scalar)
                                and "grad.<name>" for every parameter
  golden_<family>.config.json   the model's config (config.to_dict(), as save_pretrained writes it)

Also: --check-checkpoint DIR loads a microLLM training checkpoint with transformers (strictly: missing or
unexpected weights fail) and prints a greedy continuation of --prompt (byte tokenizer), to compare with
`microllm generate --checkpoint DIR --prompt ... --temperature 0`.
"""
import argparse
import json
import os
import pathlib
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "train"

COMMON = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=64, hidden_act="silu")

FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(COMMON, rope_theta=10000.0, tie_word_embeddings=True, attention_bias=False, mlp_bias=False)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(COMMON, rope_theta=1000000.0, tie_word_embeddings=False, use_sliding_window=False)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(COMMON, head_dim=12, rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False,
                   use_sliding_window=False)),
}


SEEDS = {"llama": 1234, "qwen2": 1235, "qwen3": 1236}


def randomize(model, generator):
    """Random weights: matrices N(0, 0.2^2), norm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=generator))


def make_golden(family, seed):
    config_cls, model_cls, kwargs = FAMILIES[family]
    config = config_cls(**kwargs)
    try:
        config._attn_implementation = "eager"
    except AttributeError:
        pass
    torch.manual_seed(seed)
    model = model_cls(config).float().train()
    generator = torch.Generator().manual_seed(seed)
    randomize(model, generator)
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (2, 7), generator=generator)
    targets = torch.randint(0, vocab, (2, 7), generator=generator)
    targets[1, 3] = -100
    logits = model(input_ids=ids).logits.float()  # [2, 7, vocab]
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=-100)
    model.zero_grad()
    loss.backward()

    tensors = {}
    for name, p in model.named_parameters():  # a tied head appears once, as model.embed_tokens.weight
        tensors[name] = p.detach().contiguous().clone()
        tensors["grad." + name] = p.grad.detach().contiguous().clone()
    tensors["ids"] = ids.to(torch.int64)
    tensors["targets"] = targets.to(torch.int64)
    tensors["loss"] = loss.detach().reshape(()).float()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"golden_{family}.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt", "family": family, "torch": torch.__version__,
                                            "transformers": transformers.__version__})
    config_dict = config.to_dict()
    config_dict.pop("_attn_implementation_autoset", None)
    (OUT / f"golden_{family}.config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    size = path.stat().st_size
    assert size < 1_000_000, f"{path} is {size} bytes"
    print(f"{path.relative_to(ROOT)}: loss {loss.item():.6f}, {len(list(model.parameters()))} parameters, {size} bytes")


def check_checkpoint(directory, prompt, max_tokens):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    model = model.float()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"{directory}: loading problems: {problems}", file=sys.stderr)
        return 1
    model.eval()
    ids = torch.tensor([list(prompt.encode("utf-8"))])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
    text = bytes(int(t) for t in out[0] if int(t) < 256).decode("utf-8", errors="replace")
    print(f"{directory}: {type(model).__name__} loaded strictly; greedy continuation:\n{text}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), action="append", help="default: all")
    parser.add_argument("--check-checkpoint", metavar="DIR", help="load a microLLM checkpoint with transformers")
    parser.add_argument("--prompt", default="In the beginning")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.check_checkpoint:
        return check_checkpoint(args.check_checkpoint, args.prompt, args.max_tokens)
    torch.use_deterministic_algorithms(True)
    for family in args.family or sorted(FAMILIES):
        make_golden(family, SEEDS[family])
    return 0


if __name__ == "__main__":
    sys.exit(main())
