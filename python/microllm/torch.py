"""microLLM's kernels as PyTorch operators: ``import microllm.torch`` registers ``torch.ops.microllm.*``.

    rms_norm(x, weight, eps)            weight * x / sqrt(mean(x^2, last dim) + eps), Hugging Face's roundings
    rope(x, positions, theta)           rotary embedding of x [B, T, H, D] at positions [B, T] or [T] (split-half)
    attention(q, k, v, causal, scale)   q [B, Hq, T, D], k and v [B, Hkv, S, D] -> [B, Hq, T, D]: grouped heads
                                        read in place (no repetition); scale 0 means 1 / sqrt(D)
    swiglu(gate, up)                    silu(gate) * up
    cross_entropy(logits, targets)      mean cross-entropy of logits [N, V] against targets [N] (-100 ignored)
    paged_kv_write(k_pool, v_pool, k, v, slots)      the decode step's keys and values into a paged cache (in place)
    paged_attention(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, window)
                                        decode attention of q [N, Hq, D] over each sequence's cached keys
                                        (microllm/ops/paged_attention.h); forward only

Each is a ``torch.library.custom_op`` over microLLM's CPU or CUDA kernel. Its tensors cross by DLPack, without a
copy: on CUDA microLLM's stream waits for PyTorch's current stream before the kernel and PyTorch's for microLLM's
after it (the DLPack stream protocol), so no device synchronizes. A fake kernel gives the output's shape, so
``torch.compile(fullgraph=True)`` traces the op; its backward is a custom op too (``<name>_backward``, microLLM's
autograd kernels, which recompute the forward they need), so the ops train, compiled or not.

``attention_function`` has transformers' attention-interface signature: register it with
``transformers.AttentionInterface.register("microllm", microllm.torch.attention_function)`` and load a model with
``attn_implementation="microllm"``. ``rms_norm_forward`` replaces an RMSNorm module's forward (Llama, Qwen2, Qwen3,
Mistral: ``weight`` and ``variance_epsilon``).

Needs torch 2.4 or newer (``torch.library.custom_op``).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from . import _microllm as _m

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"microllm.torch needs torch >= 2.4 (torch.library.custom_op); this is torch {torch.__version__}")

__all__ = ["attention_function", "rms_norm_forward"]


def _to_microllm(t: torch.Tensor) -> _m.Tensor:
    return _m.from_dlpack(t.detach())


def _to_torch(x: _m.Tensor) -> torch.Tensor:
    return torch.from_dlpack(x)


def _gradients(forward, inputs: Sequence[torch.Tensor], grad: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """The gradients of `forward` (over microllm.Variables) at `inputs`, given its output's gradient."""
    variables = [_m.Variable(_to_microllm(t), requires_grad=True) for t in inputs]
    forward(*variables).backward(_to_microllm(grad.contiguous()))
    return tuple(_to_torch(v.grad).contiguous() for v in variables)


# ---- rms_norm ----

@torch.library.custom_op("microllm::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _to_torch(_m.ops.rms_norm(_to_microllm(x), _to_microllm(weight), eps))


@rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("microllm::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return _gradients(lambda a, w: _m.autograd.rms_norm(a, w, eps), (x, weight), grad)


@rms_norm_backward.register_fake
def _(grad, x, weight, eps):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_grad(ctx, grad):
    x, weight = ctx.saved_tensors
    dx, dw = torch.ops.microllm.rms_norm_backward(grad, x, weight, ctx.eps)
    return dx, dw, None


rms_norm.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)


# ---- rope ----

@torch.library.custom_op("microllm::rope", mutates_args=())
def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    return _to_torch(_m.ops.rope(_to_microllm(x), _to_microllm(positions), theta=theta))


@rope.register_fake
def _(x, positions, theta):
    return x.new_empty(x.shape)


@torch.library.custom_op("microllm::rope_backward", mutates_args=())
def rope_backward(grad: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    # The rotation is linear: its gradient does not depend on x, so grad stands in for it.
    positions_m = _to_microllm(positions)
    return _gradients(lambda a: _m.autograd.rope(a, positions_m, theta=theta), (grad,), grad)[0]


@rope_backward.register_fake
def _(grad, positions, theta):
    return grad.new_empty(grad.shape)


def _rope_setup(ctx, inputs, output):
    _, positions, theta = inputs
    ctx.save_for_backward(positions)
    ctx.theta = theta


def _rope_grad(ctx, grad):
    (positions,) = ctx.saved_tensors
    return torch.ops.microllm.rope_backward(grad, positions, ctx.theta), None, None


rope.register_autograd(_rope_grad, setup_context=_rope_setup)


# ---- attention ----

@torch.library.custom_op("microllm::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    out = _m.ops.attention(_to_microllm(q), _to_microllm(k), _to_microllm(v), causal=causal, scale=scale)
    return _to_torch(out).contiguous()  # the CUDA kernels write [B, T, Hq, D] rows: one layout for every device


@attention.register_fake
def _(q, k, v, causal, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.custom_op("microllm::attention_backward", mutates_args=())
def attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _gradients(lambda a, b, c: _m.autograd.attention(a, b, c, causal=causal, scale=scale), (q, k, v), grad)


@attention_backward.register_fake
def _(grad, q, k, v, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    ctx.save_for_backward(q, k, v)
    ctx.causal, ctx.scale = causal, scale


def _attention_grad(ctx, grad):
    q, k, v = ctx.saved_tensors
    dq, dk, dv = torch.ops.microllm.attention_backward(grad, q, k, v, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


attention.register_autograd(_attention_grad, setup_context=_attention_setup)


# ---- swiglu ----

@torch.library.custom_op("microllm::swiglu", mutates_args=())
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _to_torch(_m.ops.swiglu(_to_microllm(gate), _to_microllm(up)))


@swiglu.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("microllm::swiglu_backward", mutates_args=())
def swiglu_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return _gradients(_m.autograd.swiglu, (gate, up), grad)


@swiglu_backward.register_fake
def _(grad, gate, up):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_grad(ctx, grad):
    gate, up = ctx.saved_tensors
    return torch.ops.microllm.swiglu_backward(grad, gate, up)


swiglu.register_autograd(_swiglu_grad, setup_context=_swiglu_setup)


# ---- cross_entropy ----

def _loss_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


@torch.library.custom_op("microllm::cross_entropy", mutates_args=())
def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return _to_torch(_m.ops.cross_entropy(_to_microllm(logits), _to_microllm(targets)))


@cross_entropy.register_fake
def _(logits, targets):
    return logits.new_empty((), dtype=_loss_dtype(logits))


@torch.library.custom_op("microllm::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(grad: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    targets_m = _to_microllm(targets)
    return _gradients(lambda a: _m.autograd.cross_entropy(a, targets_m), (logits,), grad)[0]


@cross_entropy_backward.register_fake
def _(grad, logits, targets):
    return logits.new_empty(logits.shape)


def _cross_entropy_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _cross_entropy_grad(ctx, grad):
    logits, targets = ctx.saved_tensors
    return torch.ops.microllm.cross_entropy_backward(grad, logits, targets), None


cross_entropy.register_autograd(_cross_entropy_grad, setup_context=_cross_entropy_setup)


# ---- the decode attention over a paged KV cache (forward only: a decode step is not differentiated) ----

@torch.library.custom_op("microllm::paged_kv_write", mutates_args=("k_pool", "v_pool"))
def paged_kv_write(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   slots: torch.Tensor) -> None:
    _m.ops.paged_kv_write(_to_microllm(k_pool), _to_microllm(v_pool), _to_microllm(k), _to_microllm(v),
                          _to_microllm(slots))


@paged_kv_write.register_fake
def _(k_pool, v_pool, k, v, slots):
    return None


@torch.library.custom_op("microllm::paged_attention", mutates_args=())
def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                    seq_ids: torch.Tensor, positions: torch.Tensor, scale: float, max_context: int,
                    window: int) -> torch.Tensor:
    out = _m.ops.paged_attention(_to_microllm(q), _to_microllm(k_pool), _to_microllm(v_pool),
                                 _to_microllm(block_tables), _to_microllm(seq_ids), _to_microllm(positions),
                                 scale=scale, max_context=max_context, window=window)
    return _to_torch(out)


@paged_attention.register_fake
def _(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, window):
    return q.new_empty(q.shape)


# ---- transformers ----

def _check_causal_only(mask: torch.Tensor, queries: int, keys: int) -> None:
    """A 4-D mask (boolean or additive) that hides more than the future (padding, a window) would be ignored:
    refused."""
    if torch.compiler.is_compiling():
        return  # traced: checked in eager runs only
    mask = mask[..., :queries, :keys]
    visible = mask if mask.dtype == torch.bool else mask == 0  # boolean: True attends; additive: 0 attends
    causal = torch.ones(queries, keys, dtype=torch.bool, device=mask.device).tril(keys - queries)
    if not torch.equal(visible, causal.expand_as(visible)):
        raise ValueError("microllm attention_function: the attention mask hides more than future keys (padding or "
                         "a sliding window); microllm.torch runs causal attention only")


def attention_function(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                       **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' attention interface: causal attention of query [B, Hq, T, D] over key and value [B, Hkv, S, D]
    -> ([B, T, Hq, D], None). No dropout, no padding mask, no sliding window (each refused)."""
    if dropout and module.training:
        raise ValueError("microllm attention_function: attention dropout is not supported")
    if kwargs.get("sliding_window"):
        raise ValueError("microllm attention_function: sliding windows are not supported")
    if attention_mask is not None:
        _check_causal_only(attention_mask, query.shape[2], key.shape[2])
    out = torch.ops.microllm.attention(query, key, value, True, float(scaling) if scaling else 0.0)
    return out.transpose(1, 2).contiguous(), None


def rms_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """An RMSNorm module's forward (weight, variance_epsilon) through microllm::rms_norm: assign it to the class's
    ``forward``."""
    return torch.ops.microllm.rms_norm(hidden_states, self.weight, self.variance_epsilon)
