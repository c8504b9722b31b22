"""microllm.torch: microLLM's kernels as torch.ops.microllm.* (CPU, and CUDA where both sides have it).

Needs torch >= 2.4 (torch.library.custom_op): the GPU machine has it; Debian's python3-torch (1.13) is too old, so
these tests skip there, saying so. Each op equals PyTorch's own composition in value and gradient, passes
torch.library.opcheck, traces under torch.compile(fullgraph=True), and a transformers Qwen2 model running microLLM's
attention and RMSNorm gives transformers' logits and gradients.
"""
import copy

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not hasattr(torch.library, "custom_op"):
    pytest.skip(f"torch {torch.__version__} has no torch.library.custom_op (2.4+)", allow_module_level=True)

import microllm  # noqa: E402
import microllm.torch  # noqa: E402,F401  (registers torch.ops.microllm)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and microllm.cuda_available() else [])


def close(a, b, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=atol)


def reference_rms_norm(x, w, eps):
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def reference_rope(x, positions, theta):
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float().to(x.device) / d))
    angles = positions.float()[..., None] * inv_freq  # [T, D/2]
    emb = torch.cat([angles, angles], -1)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()


def reference_attention(q, k, v, scale):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def leaves(*shapes, device, dtype=torch.float32, generator=None):
    return [torch.randn(s, device=device, dtype=dtype, generator=generator).requires_grad_() for s in shapes]


def check_against(op, reference, inputs, rtol=1e-5, atol=1e-6):
    """op(*inputs) equals reference(*inputs), and so do their gradients of a random projection of the output."""
    ours = op(*inputs)
    theirs = reference(*inputs)
    close(ours, theirs, rtol, atol)
    weight = torch.randn_like(theirs)
    tensors = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    g_ours = torch.autograd.grad((ours * weight).sum(), tensors)
    g_theirs = torch.autograd.grad((theirs * weight).sum(), tensors)
    for a, b in zip(g_ours, g_theirs):
        close(a, b, rtol, atol)


@pytest.mark.parametrize("device", DEVICES)
def test_each_op_equals_torch_in_value_and_gradient(device):
    torch.manual_seed(0)
    x, w = leaves((2, 5, 64), (64,), device=device)
    check_against(lambda a, b: torch.ops.microllm.rms_norm(a, b, 1e-6), lambda a, b: reference_rms_norm(a, b, 1e-6),
                  [x, w])
    (x,) = leaves((2, 7, 3, 16), device=device)
    positions = torch.arange(3, 10, device=device)
    check_against(lambda a: torch.ops.microllm.rope(a, positions, 10000.0),
                  lambda a: reference_rope(a, positions, 10000.0), [x], 1e-4, 1e-5)
    q, k, v = leaves((2, 6, 9, 32), (2, 2, 9, 32), (2, 2, 9, 32), device=device)
    check_against(lambda a, b, c: torch.ops.microllm.attention(a, b, c, True, 0.0),
                  lambda a, b, c: reference_attention(a, b, c, None), [q, k, v], 1e-4, 1e-5)
    gate, up = leaves((4, 48), (4, 48), device=device)
    check_against(torch.ops.microllm.swiglu, lambda a, b: torch.nn.functional.silu(a) * b, [gate, up])
    (logits,) = leaves((6, 50), device=device)
    targets = torch.tensor([3, 0, 49, -100, 7, 11], device=device)
    check_against(lambda a: torch.ops.microllm.cross_entropy(a, targets),
                  lambda a: torch.nn.functional.cross_entropy(a, targets), [logits], 1e-5, 1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_passes_for_every_op(device):
    torch.manual_seed(1)
    r = lambda *s: torch.randn(*s, device=device, requires_grad=True)  # noqa: E731
    samples = {
        torch.ops.microllm.rms_norm.default: (r(3, 32), r(32), 1e-5),
        torch.ops.microllm.rope.default: (r(1, 4, 2, 8), torch.arange(4, device=device), 500.0),
        torch.ops.microllm.attention.default: (r(1, 4, 5, 16), r(1, 2, 5, 16), r(1, 2, 5, 16), True, 0.25),
        torch.ops.microllm.swiglu.default: (r(3, 8), r(3, 8)),
        torch.ops.microllm.cross_entropy.default: (r(4, 10), torch.tensor([1, 2, 3, 9], device=device)),
    }
    for op, args in samples.items():
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_fullgraph_equals_eager(device):
    torch.manual_seed(2)

    def block(x, w, q, k, v):
        return torch.ops.microllm.rms_norm(x, w, 1e-6).sum() + torch.ops.microllm.attention(q, k, v, True, 0.0).sum()

    inputs = leaves((2, 3, 32), (32,), (1, 4, 6, 16), (1, 2, 6, 16), (1, 2, 6, 16), device=device)
    compiled = torch.compile(block, fullgraph=True)
    eager_value = block(*inputs)
    eager_grads = torch.autograd.grad(eager_value, inputs)
    compiled_value = compiled(*inputs)
    compiled_grads = torch.autograd.grad(compiled_value, inputs)
    close(compiled_value, eager_value)
    for a, b in zip(compiled_grads, eager_grads):
        close(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_dlpack_round_trip_keeps_the_memory(device):
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        t = torch.arange(12, device=device).reshape(3, 4).to(dtype)
        m = microllm.from_dlpack(t)
        back = torch.from_dlpack(m)
        assert back.data_ptr() == t.data_ptr(), dtype
        assert torch.equal(back, t)
    # A torch op on a microLLM tensor and back.
    m = microllm.from_dlpack(torch.ones(4, device=device, dtype=torch.bfloat16))
    doubled = torch.from_dlpack(m) * 2
    assert torch.equal(torch.from_dlpack(microllm.from_dlpack(doubled)), torch.full((4,), 2.0, device=device,
                                                                                      dtype=torch.bfloat16))


def qwen2_pair(device):
    """A tiny random Qwen2 model twice: transformers' eager attention and RMSNorm, and microLLM's."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2 import modeling_qwen2

    config = transformers.Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=True)
    torch.manual_seed(3)
    reference = transformers.Qwen2ForCausalLM(config).to(device).eval()
    transformers.AttentionInterface.register("microllm", microllm.torch.attention_function)
    ours = transformers.Qwen2ForCausalLM(copy.deepcopy(config)).to(device).eval()
    ours.load_state_dict(reference.state_dict())
    ours.config._attn_implementation = "microllm"
    reference.config._attn_implementation = "eager"
    return reference, ours, modeling_qwen2.Qwen2RMSNorm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True])
def test_transformers_qwen2_with_microllm_ops_gives_its_logits_and_gradients(device, compiled, monkeypatch):
    reference, ours, rms_norm_class = qwen2_pair(device)
    ids = torch.randint(0, 128, (2, 12), device=device, generator=torch.Generator(device).manual_seed(4))
    ref_logits = reference(input_ids=ids).logits
    ref_loss = torch.nn.functional.cross_entropy(ref_logits.reshape(-1, 128), ids.reshape(-1))
    ref_grads = torch.autograd.grad(ref_loss, list(reference.parameters()))

    monkeypatch.setattr(rms_norm_class, "forward", microllm.torch.rms_norm_forward)
    forward = torch.compile(ours, fullgraph=True) if compiled else ours
    logits = forward(input_ids=ids).logits
    loss = torch.ops.microllm.cross_entropy(logits.reshape(-1, 128), ids.reshape(-1))
    grads = torch.autograd.grad(loss, list(ours.parameters()))
    close(logits, ref_logits, 1e-4, 1e-5)
    close(loss, ref_loss, 1e-5, 1e-6)
    for (name, _), a, b in zip(ours.named_parameters(), grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_model_logits_equal_transformers_on_a_random_weight_model(device, tmp_path):
    reference, _, _ = qwen2_pair("cpu")
    reference.save_pretrained(str(tmp_path))
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
    model = microllm.load_model(str(tmp_path), device=device, dtype="f32")
    got = torch.from_dlpack(model.logits(ids.tolist())).cpu()
    close(got, expected, 1e-5, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_decode_attention_equals_sdpa_over_each_sequence(device):
    """Two sequences' keys written into shuffled blocks by microllm::paged_kv_write, one decode query each against
    them (the second within a window of 5) by microllm::paged_attention, against sdpa over each sequence's keys."""
    torch.manual_seed(6)
    hq, hkv, d, block = 4, 2, 16, 4
    lengths = [9, 14]
    blocks = torch.randperm(8).to(torch.int32)
    tables = torch.stack([blocks[:4], blocks[4:]]).to(device)
    k_pool = torch.randn(8, block, hkv, d, device=device)
    v_pool = torch.randn(8, block, hkv, d, device=device)
    keys = [torch.randn(n, hkv, d, device=device) for n in lengths]
    values = [torch.randn(n, hkv, d, device=device) for n in lengths]
    slots = torch.tensor([int(tables[s][i // block]) * block + i % block for s, n in enumerate(lengths)
                          for i in range(n)], dtype=torch.int32, device=device)
    torch.ops.microllm.paged_kv_write(k_pool, v_pool, torch.cat(keys), torch.cat(values), slots)
    q = torch.randn(2, hq, d, device=device)
    seq_ids = torch.tensor([0, 1], dtype=torch.int32, device=device)
    positions = torch.tensor([n - 1 for n in lengths], dtype=torch.int32, device=device)
    for window in (0, 5):
        out = torch.ops.microllm.paged_attention(q, k_pool, v_pool, tables, seq_ids, positions, 0.0, 0, window)
        for n in range(2):
            first = max(0, lengths[n] - window) if window else 0
            k = keys[n][first:].transpose(0, 1)[None].repeat_interleave(hq // hkv, 1)
            v = values[n][first:].transpose(0, 1)[None].repeat_interleave(hq // hkv, 1)
            expected = torch.nn.functional.scaled_dot_product_attention(q[n][None, :, None], k, v)[0, :, 0]
            close(out[n], expected, 1e-4, 1e-5)
    torch.library.opcheck(torch.ops.microllm.paged_attention.default,
                          (q, k_pool, v_pool, tables, seq_ids, positions, 0.0, 0, 0))
    torch.library.opcheck(torch.ops.microllm.paged_kv_write.default,
                          (k_pool.clone(), v_pool.clone(), torch.cat(keys)[:2], torch.cat(values)[:2], slots[:2]))
