#!/usr/bin/env python3
"""Reference activations (and gradients) of a Hugging Face model at microLLM's tap points, for `microllm align`.

Run where torch and transformers are installed (the GPU machine); no network is used:

    python3 tools/oracle/align_reference.py --model DIR --out dump.safetensors [--dtype bf16] [--backward]
        [--ids "1,2,3;4,5,6"] [--batch 2 --tokens 8 --seed 0] [--device cpu|cuda]
    python3 tools/oracle/align_reference.py --fixtures     # tests/fixtures/align/*.safetensors

Hooks on transformers' own modules record the tensors microLLM's taps name (include/microllm/nn/taps.h):
forward hooks give module outputs (embed_tokens, input_layernorm, {q,k,v}_proj, {q,k}_norm, o_proj, mlp,
gate/up_proj, the layers, norm), forward pre-hooks give inputs (o_proj.input, mlp.down_proj.input, and the
post-attention residual as the input of the norm that follows it), the module's apply_rotary_pos_emb is wrapped
for q/k after the rotary embedding (transposed to [B, T, H, D]), and output_attentions=True (eager attention)
gives attn_weights. With --backward the loss is the mean cross-entropy of the logits against `targets`
(as TransformerLM::loss), and each point's gradient is stored as "grad/<name>".

The file holds input_ids [B, T] int64, targets [B, T] int64, every point as float32 (widened from --dtype), and
metadata: dtype, model, loss, torch and transformers versions. Written atomically (temporary file, rename).
"""
import argparse
import importlib
import os
import pathlib
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
# name: (model directory under tests/fixtures/models, dtype, backward)
FIXTURE_DUMPS = {
    "qwen2_f32": ("qwen2", "f32", True),
    "qwen3_f32": ("qwen3", "f32", True),
    "qwen2_bf16": ("qwen2", "bf16", True),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def first_tensor(value):
    return value[0] if isinstance(value, (tuple, list)) else value


class Recorder:
    """Keeps each point's tensor (its value now, its .grad after backward) in forward order."""

    def __init__(self, backward):
        self.backward = backward
        self.points = []  # (name, tensor as produced, transpose_heads)

    def keep(self, name, tensor, transpose_heads=False):
        if self.backward and tensor.requires_grad:
            tensor.retain_grad()
        self.points.append((name, tensor, transpose_heads))

    def output_hook(self, name):
        return lambda module, args, output: self.keep(name, first_tensor(output))

    def input_hook(self, name):
        return lambda module, args: self.keep(name, args[0])

    def values(self):
        return {name: (t.transpose(1, 2) if heads else t).detach().float().contiguous().cpu()
                for name, t, heads in self.points}

    def gradients(self):
        grads = {}
        for name, t, heads in self.points:
            if t.grad is not None:
                g = t.grad.transpose(1, 2) if heads else t.grad
                grads["grad/" + name] = g.detach().float().contiguous().cpu()
        return grads


def attach(model, recorder):
    """Hooks on every tap point; returns a function that removes them."""
    handles, restore = [], []
    inner = model.model
    handles.append(inner.embed_tokens.register_forward_hook(recorder.output_hook("model.embed_tokens")))
    for i, layer in enumerate(inner.layers):
        p = f"model.layers.{i}"
        a = layer.self_attn
        handles.append(layer.input_layernorm.register_forward_hook(recorder.output_hook(f"{p}.input_layernorm")))
        for proj in ("q_proj", "k_proj", "v_proj"):
            handles.append(getattr(a, proj).register_forward_hook(recorder.output_hook(f"{p}.self_attn.{proj}")))
        for norm in ("q_norm", "k_norm"):
            if hasattr(a, norm):
                handles.append(getattr(a, norm).register_forward_hook(recorder.output_hook(f"{p}.self_attn.{norm}")))
        handles.append(a.o_proj.register_forward_pre_hook(recorder.input_hook(f"{p}.self_attn.o_proj.input")))
        handles.append(a.o_proj.register_forward_hook(recorder.output_hook(f"{p}.self_attn.o_proj")))
        sandwich = hasattr(layer, "pre_feedforward_layernorm")
        if sandwich:
            handles.append(layer.post_attention_layernorm.register_forward_hook(
                recorder.output_hook(f"{p}.post_attention_layernorm")))
            mlp_norm = layer.pre_feedforward_layernorm
            handles.append(mlp_norm.register_forward_pre_hook(recorder.input_hook(f"{p}.attention_residual")))
            handles.append(mlp_norm.register_forward_hook(recorder.output_hook(f"{p}.pre_feedforward_layernorm")))
        else:
            mlp_norm = layer.post_attention_layernorm
            handles.append(mlp_norm.register_forward_pre_hook(recorder.input_hook(f"{p}.attention_residual")))
            handles.append(mlp_norm.register_forward_hook(recorder.output_hook(f"{p}.post_attention_layernorm")))
        mlp = layer.mlp
        handles.append(mlp.gate_proj.register_forward_hook(recorder.output_hook(f"{p}.mlp.gate_proj")))
        handles.append(mlp.up_proj.register_forward_hook(recorder.output_hook(f"{p}.mlp.up_proj")))
        handles.append(mlp.down_proj.register_forward_pre_hook(recorder.input_hook(f"{p}.mlp.down_proj.input")))
        handles.append(mlp.register_forward_hook(recorder.output_hook(f"{p}.mlp")))
        if sandwich:
            handles.append(layer.post_feedforward_layernorm.register_forward_hook(
                recorder.output_hook(f"{p}.post_feedforward_layernorm")))
        handles.append(layer.register_forward_hook(recorder.output_hook(p)))
    handles.append(inner.norm.register_forward_hook(recorder.output_hook("model.norm")))

    # q and k after the rotary embedding: the modeling module's apply_rotary_pos_emb, wrapped. Calls come in
    # layer order, one per layer.
    module = importlib.import_module(type(inner.layers[0].self_attn).__module__)
    original = module.apply_rotary_pos_emb
    calls = {"layer": 0}

    def rotary(q, k, *args, **kwargs):
        q_out, k_out = original(q, k, *args, **kwargs)
        p = f"model.layers.{calls['layer']}.self_attn"
        calls["layer"] += 1
        recorder.keep(f"{p}.q_rotary", q_out, transpose_heads=True)
        recorder.keep(f"{p}.k_rotary", k_out, transpose_heads=True)
        return q_out, k_out

    module.apply_rotary_pos_emb = rotary
    restore.append(lambda: setattr(module, "apply_rotary_pos_emb", original))

    def detach():
        for h in handles:
            h.remove()
        for r in restore:
            r()
    return detach


def parse_ids(text):
    rows = [[int(x) for x in row.split(",") if x.strip()] for row in text.split(";") if row.strip()]
    if not rows or any(len(r) != len(rows[0]) or not r for r in rows):
        raise SystemExit(f"--ids: sequences must be non-empty and of equal length: {text!r}")
    return torch.tensor(rows, dtype=torch.int64)


def dump(model_dir, out, dtype="f32", backward=False, ids=None, batch=2, tokens=8, seed=0, device="cpu"):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="eager")
    model = model.to(device=device, dtype=DTYPES[dtype])
    model.eval()  # no dropout; gradients still flow
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    if ids is None:
        ids = torch.randint(0, vocab, (batch, tokens), generator=generator, dtype=torch.int64)
    targets = torch.randint(0, vocab, tuple(ids.shape), generator=generator, dtype=torch.int64)

    recorder = Recorder(backward)
    detach = attach(model, recorder)
    try:
        with torch.set_grad_enabled(backward):
            outputs = model(input_ids=ids.to(device), output_attentions=True, use_cache=False)
            logits = outputs.logits
            recorder.keep("logits", logits)
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), targets.to(device).reshape(-1))
            if backward:
                loss.backward()
    finally:
        detach()

    tensors = {"input_ids": ids.contiguous(), "targets": targets.contiguous()}
    tensors.update(recorder.values())
    for i, weights in enumerate(outputs.attentions):
        tensors[f"model.layers.{i}.self_attn.attn_weights"] = weights.detach().float().contiguous().cpu()
    if backward:
        tensors.update(recorder.gradients())
    expected_layers = model.config.num_hidden_layers
    rotary = sum(1 for name in tensors if name.endswith(".q_rotary") and not name.startswith("grad/"))
    if rotary != expected_layers:
        raise RuntimeError(f"recorded q after the rotary embedding for {rotary} of {expected_layers} layers: "
                           "apply_rotary_pos_emb was not called through the modeling module")

    out = pathlib.Path(out)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata={
        "format": "pt", "dtype": dtype, "model": pathlib.Path(model_dir).name, "loss": repr(float(loss)),
        "backward": str(bool(backward)).lower(), "torch": torch.__version__,
        "transformers": transformers.__version__})
    tmp.replace(out)
    grads = sum(1 for name in tensors if name.startswith("grad/"))
    print(f"{out}: {len(tensors) - 2 - grads} values, {grads} gradients, loss {float(loss):.6f}, "
          f"{out.stat().st_size} bytes")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="Hugging Face model directory")
    parser.add_argument("--out", help="output .safetensors")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    parser.add_argument("--backward", action="store_true", help="also the gradients of the mean cross-entropy")
    parser.add_argument("--ids", help='token ids, e.g. "1,2,3;4,5,6" (default: random, seeded)')
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fixtures", action="store_true", help="write tests/fixtures/align/*.safetensors")
    args = parser.parse_args()
    if args.fixtures:
        (FIXTURES / "align").mkdir(parents=True, exist_ok=True)
        for name, (model, dtype, backward) in FIXTURE_DUMPS.items():
            dump(FIXTURES / "models" / model, FIXTURES / "align" / f"{name}.safetensors", dtype, backward,
                 batch=2, tokens=8, seed=7)
        return 0
    if not args.model or not args.out:
        parser.error("--model and --out are required (or --fixtures)")
    ids = parse_ids(args.ids) if args.ids else None
    dump(args.model, args.out, args.dtype, args.backward, ids, args.batch, args.tokens, args.seed, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
