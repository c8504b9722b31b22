"""microllm.ops against NumPy references on fresh random inputs (the seed is printed on failure), with every new
allocation poisoned (0xFF: NaN, -1), so an output element an op forgets to write fails the comparison; errors are
the library's exceptions with its messages; the Tensor's operators."""
import math
import threading

import numpy as np
import pytest

import microllm
from microllm import ops


@pytest.fixture(autouse=True)
def poisoned_allocations():
    microllm.set_poison_new_allocations(True)
    yield
    microllm.set_poison_new_allocations(False)


@pytest.fixture
def rng():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"random seed: {seed}")  # shown by pytest when the test fails
    return np.random.default_rng(seed)


def normal(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def close(tensor, expected, rtol=1e-5, atol=1e-5):
    got = np.asarray(tensor)
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def T(array):
    return microllm.tensor(array)


# ---- elementwise ----

def erf(x):
    return np.vectorize(math.erf)(x)


UNARY = {
    "neg": lambda x: -x,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "square": np.square,
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_ops(name, rng):
    x = normal(rng, 3, 17)
    if name in ("log", "sqrt", "rsqrt"):
        x = np.abs(x) + 0.1  # their domain
    close(getattr(ops, name)(T(x)), UNARY[name](x).astype(np.float32))


def test_gelu_and_scale(rng):
    x = normal(rng, 4, 9).astype(np.float64)
    close(ops.gelu(T(x)), 0.5 * x * (1 + erf(x / math.sqrt(2))), rtol=1e-12, atol=1e-12)
    tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    close(ops.gelu(T(x), tanh_approximation=True), tanh_form, rtol=1e-12, atol=1e-12)
    close(ops.scale(T(x), alpha=-2.5), -2.5 * x, rtol=0, atol=0)


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "maximum": np.maximum, "minimum": np.minimum}
COMPARISONS = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
               "gt": np.greater, "ge": np.greater_equal}


@pytest.mark.parametrize("name", list(BINARY) + list(COMPARISONS))
def test_binary_ops_broadcast(name, rng):
    a = normal(rng, 4, 1, 6)
    b = normal(rng, 3, 1)
    b[0, 0] = a[0, 0, 0]  # one equal pair for the comparisons
    if name in BINARY:
        close(getattr(ops, name)(a=T(a), b=T(b)), BINARY[name](a, b))
    else:
        got = getattr(ops, name)(T(a), T(b))
        assert got.dtype == "u8"
        np.testing.assert_array_equal(np.asarray(got), COMPARISONS[name](a, b).astype(np.uint8))


def test_integer_arithmetic_and_numbers(rng):
    a = rng.integers(-50, 50, size=(5, 4)).astype(np.int64)
    b = rng.integers(-50, 50, size=(4,)).astype(np.int64)
    np.testing.assert_array_equal(np.asarray(ops.add(T(a), T(b))), a + b)
    np.testing.assert_array_equal(np.asarray(ops.mul(T(a), 3)), a * 3)
    np.testing.assert_array_equal(np.asarray(ops.sub(7, T(a))), 7 - a)
    with pytest.raises(TypeError, match="takes tensors"):
        ops.add(1, 2)


def test_tensor_operators(rng):
    a, b = normal(rng, 3, 4), normal(rng, 3, 4)
    m = normal(rng, 4, 5)
    ta, tb = T(a), T(b)
    close(ta + tb, a + b)
    close(ta - tb, a - b)
    close(ta * tb, a * b)
    close(ta / (tb * tb + 1.0), a / (b * b + 1), rtol=1e-5)
    close(-ta, -a)
    close(ta + 1.5, a + 1.5)
    close(2.0 * ta, 2 * a)
    close(1.0 - ta, 1 - a)
    close(2.0 / (ta * ta + 1.0), 2 / (a * a + 1), rtol=1e-5)
    close(ta @ T(m), a @ m, rtol=1e-4)
    with pytest.raises(TypeError):
        ta + "x"


def test_where_masked_fill_cast_sum_to(rng):
    a, b = normal(rng, 2, 5), normal(rng, 5)
    cond = (normal(rng, 2, 5) > 0).astype(np.uint8)
    close(ops.where(T(cond), T(a), T(b)), np.where(cond != 0, a, b))
    close(ops.masked_fill(T(a), T(cond[0]), -7.0), np.where(cond[0] != 0, -7.0, a).astype(np.float32))
    as_f16 = ops.cast(T(a), dtype="f16")
    assert as_f16.dtype == "f16"
    close(as_f16, a.astype(np.float16), rtol=0, atol=0)
    close(ops.sum_to(T(a), (1, 5)), a.sum(axis=0, keepdims=True))


# ---- linear algebra, norms, softmax ----

def test_matmul_against_numpy(rng):
    a = normal(rng, 2, 1, 5, 7, dtype=np.float64)
    b = normal(rng, 3, 7, 4, dtype=np.float64)
    close(ops.matmul(T(a), T(b)), a @ b, rtol=1e-12)
    close(ops.matmul(T(a.swapaxes(-1, -2).copy()), T(b), transpose_a=True), a @ b, rtol=1e-12)
    close(ops.matmul(T(a), T(b.swapaxes(-1, -2).copy()), transpose_b=True), a @ b, rtol=1e-12)
    x, y = normal(rng, 33, 65), normal(rng, 65, 17)
    close(ops.matmul(T(x), T(y)), x @ y, rtol=1e-4, atol=1e-4)
    close(ops.matmul(T(x[:, ::2]), T(y[::2])), x[:, ::2] @ y[::2], rtol=1e-4, atol=1e-4)  # strided, shared


def test_matmul_shape_mismatch_names_op_and_shapes():
    with pytest.raises(microllm.ShapeError) as raised:
        ops.matmul(microllm.zeros((2, 3)), microllm.zeros((4, 5)))
    message = str(raised.value)
    assert message.startswith("[matmul] inner dims differ")
    assert "[2, 3]" in message and "[4, 5]" in message
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, microllm.Error)
    with pytest.raises(microllm.ShapeError, match=r"\[matmul\]"):
        microllm.zeros((2, 3)) @ microllm.zeros((4, 5))
    with pytest.raises(microllm.DTypeError):
        ops.matmul(microllm.zeros((2, 3)), microllm.zeros((3, 2), dtype="f64"))


def test_linear_and_linear_add(rng):
    x, w, bias, addend = normal(rng, 2, 3, 8), normal(rng, 5, 8), normal(rng, 5), normal(rng, 2, 3, 5)
    close(ops.linear(T(x), T(w)), x @ w.T, rtol=1e-5)
    close(ops.linear(T(x), T(w), bias=T(bias)), x @ w.T + bias, rtol=1e-5)
    close(ops.linear_add(T(x), T(w), T(bias), T(addend)), addend + x @ w.T + bias, rtol=1e-5)
    with pytest.raises(microllm.ShapeError, match=r"\[linear\]"):
        ops.linear(T(x), T(w.T.copy()))


def rms_norm_reference(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def test_rms_norm(rng):
    x, residual, w = normal(rng, 3, 4, 16), normal(rng, 3, 4, 16), normal(rng, 16)
    close(ops.rms_norm(T(x), T(w), eps=1e-6), rms_norm_reference(x, w, 1e-6))
    out, h = ops.rms_norm_residual(T(x), T(residual), T(w), 1e-5)
    close(h, x + residual)
    close(out, rms_norm_reference(x + residual, w, 1e-5), rtol=1e-5)
    with pytest.raises(microllm.ShapeError, match=r"\[rms_norm\]"):
        ops.rms_norm(T(x), T(w[:8]), 1e-6)


def test_qk_rms_norm(rng):
    # q and k as the column views of one qkv projection [B, T, (Hq + 2 Hk) D], each head normalized by its weight.
    qkv = T(normal(rng, 2, 3, (4 + 2 * 2) * 8))
    q = qkv.narrow(2, 0, 32).view([2, 3, 4, 8])
    k = qkv.narrow(2, 32, 16).view([2, 3, 2, 8])
    q_w, k_w = normal(rng, 8), normal(rng, 8)
    q_out, k_out = ops.qk_rms_norm(q, k, T(q_w), T(k_w), 1e-6)
    close(q_out, rms_norm_reference(np.asarray(q), q_w, 1e-6), rtol=1e-5, atol=1e-6)
    close(k_out, rms_norm_reference(np.asarray(k), k_w, 1e-6), rtol=1e-5, atol=1e-6)
    with pytest.raises(microllm.ShapeError, match="k weight shape"):
        ops.qk_rms_norm(q, k, T(q_w), T(k_w[:4]), 1e-6)


def test_rms_norm_linear(rng):
    x, residual, norm_w = normal(rng, 2, 16), normal(rng, 2, 16), normal(rng, 16)
    w, bias = normal(rng, 12, 16), normal(rng, 12)
    n = rms_norm_reference(x + residual, norm_w, 1e-6)
    out, h = ops.rms_norm_linear(T(x), T(residual), T(norm_w), 1e-6, T(w), T(bias))
    close(h, x + residual)
    close(out, n @ w.T + bias, rtol=1e-4, atol=1e-4)
    gated, _ = ops.rms_norm_linear(T(x), None, T(norm_w), 1e-6, T(w), gate="swiglu")
    projected = rms_norm_reference(x, norm_w, 1e-6) @ w.T
    gate, up = projected[:, :6], projected[:, 6:]
    close(gated, gate / (1 + np.exp(-gate)) * up, rtol=1e-4, atol=1e-4)
    # A sandwich block: x normalized by its own weight before the residual add, then GeGLU (Gemma's MLP input).
    x_norm_w = normal(rng, 16)
    gated, h = ops.rms_norm_linear(T(x), T(residual), T(norm_w), 1e-6, T(w), gate="geglu", x_norm_weight=T(x_norm_w))
    h_want = rms_norm_reference(x, x_norm_w, 1e-6) + residual
    close(h, h_want, rtol=1e-5, atol=1e-5)
    projected = rms_norm_reference(h_want, norm_w, 1e-6) @ w.T
    gate, up = projected[:, :6], projected[:, 6:]
    gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3)))
    close(gated, gelu * up, rtol=1e-4, atol=1e-4)
    with pytest.raises(microllm.ValueError, match="gate must be"):
        ops.rms_norm_linear(T(x), None, T(norm_w), 1e-6, T(w), gate="relu")


def softmax_reference(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_and_log_softmax(rng):
    x = normal(rng, 3, 5, 7) * 4
    close(ops.softmax(T(x)), softmax_reference(x, -1))
    close(ops.softmax(T(x), dim=1), softmax_reference(x, 1))
    close(ops.log_softmax(T(x), dim=0), np.log(softmax_reference(x, 0)), rtol=1e-4, atol=1e-5)


def test_swiglu(rng):
    gate, up = normal(rng, 4, 10), normal(rng, 4, 10)
    close(ops.swiglu(T(gate), T(up)), gate / (1 + np.exp(-gate)) * up, rtol=1e-5)


# ---- attention and rotary ----

def attention_reference(q, k, v, causal, scale, q_offset):
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    scores = q @ k.swapaxes(-1, -2) * scale
    t, s = scores.shape[-2:]
    if causal:
        hidden = np.arange(s)[None, :] > q_offset + np.arange(t)[:, None]
        scores = np.where(hidden, -np.inf, scores)
    lse = np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1)) + scores.max(-1)
    return softmax_reference(scores, -1) @ v, lse, softmax_reference(scores, -1)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_gqa(causal, rng):
    b, hq, hkv, t, s, d = 2, 4, 2, 5, 7, 8
    q, k, v = normal(rng, b, hq, t, d), normal(rng, b, hkv, s, d), normal(rng, b, hkv, s, d)
    q_offset = s - t
    out_ref, lse_ref, weights_ref = attention_reference(q, k, v, causal, 1 / math.sqrt(d), q_offset)
    out = ops.attention(T(q), T(k), T(v), causal=causal, q_offset=q_offset)
    assert out.shape == (b, hq, t, d)
    close(out, out_ref, rtol=1e-4, atol=1e-5)
    out, lse = ops.attention(T(q), T(k), T(v), causal=causal, q_offset=q_offset, scale=0.3, return_lse=True)
    out_ref, lse_ref, _ = attention_reference(q, k, v, causal, 0.3, q_offset)
    close(out, out_ref, rtol=1e-4, atol=1e-5)
    close(lse, lse_ref, rtol=1e-4, atol=1e-5)
    weights = ops.attention_weights(T(q), T(k), causal=causal, q_offset=q_offset)
    close(weights, weights_ref, rtol=1e-4, atol=1e-6)


def test_attention_with_mask_and_errors(rng):
    q, k, v = normal(rng, 1, 2, 3, 4), normal(rng, 1, 2, 3, 4), normal(rng, 1, 2, 3, 4)
    mask = np.array([[1, 0, 1]], dtype=np.uint8)  # key 1 hidden from every query
    out = ops.attention(T(q), T(k), T(v), causal=False, mask=T(mask))
    keep = [0, 2]
    reference, _, _ = attention_reference(q, k[:, :, keep], v[:, :, keep], False, 0.5, 0)
    close(out, reference, rtol=1e-4, atol=1e-5)
    with pytest.raises(microllm.Error, match=r"\[attention\]"):
        ops.attention(T(q), T(k[:, :, :, :2].copy()), T(v), causal=False)


def test_paged_kv_write_and_paged_attention_equal_attention_over_each_sequence(rng):
    """Two sequences' keys scattered over shuffled blocks of 4 slots; one decode query each (and a padding row)
    attends to its own keys, the second within a window of 3."""
    hq, hkv, d, block = 4, 2, 8, 4
    lengths = [7, 10]
    blocks = rng.permutation(6).astype(np.int32)
    tables = np.array([blocks[:3], blocks[3:]], np.int32)
    k_pool, v_pool = normal(rng, 6, block, hkv, d), normal(rng, 6, block, hkv, d)
    keys = [normal(rng, n, hkv, d) for n in lengths]
    values = [normal(rng, n, hkv, d) for n in lengths]
    slots = np.concatenate([[tables[s][i // block] * block + i % block for i in range(n)]
                            for s, n in enumerate(lengths)]).astype(np.int32)
    kp, vp = T(k_pool), T(v_pool)
    ops.paged_kv_write(kp, vp, T(np.concatenate(keys)), T(np.concatenate(values)), T(slots))
    q = normal(rng, 3, hq, d)
    seq_ids = np.array([0, 1, 0], np.int32)
    positions = np.array([lengths[0] - 1, lengths[1] - 1, -1], np.int32)
    for window in (0, 3):
        out = ops.paged_attention(T(q), kp, vp, T(tables), T(seq_ids), T(positions), window=window)
        for n in range(2):
            first = max(0, lengths[n] - window) if window else 0
            k, v = keys[n][first:].transpose(1, 0, 2)[None], values[n][first:].transpose(1, 0, 2)[None]
            expected, _, _ = attention_reference(q[n][None, :, None], k, v, False, 1 / math.sqrt(d), 0)
            close(out[n], expected[0, :, 0], rtol=1e-4, atol=1e-5)
        close(out[2], np.zeros((hq, d), np.float32))
    with pytest.raises(microllm.Error, match=r"paged_attention"):
        ops.paged_attention(T(q), kp, vp, T(tables), T(seq_ids[:2].copy()), T(positions))


def rope_reference(x, positions, theta, interleaved):
    d = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angle = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [T, D/2]
    cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        return out
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


@pytest.mark.parametrize("layout", ["split_half", "interleaved"])
def test_rope(layout, rng):
    x = normal(rng, 2, 5, 3, 8, dtype=np.float64)
    positions = rng.integers(0, 100, size=5).astype(np.int64)
    got = ops.rope(T(x), T(positions), theta=500.0, layout=layout)
    close(got, rope_reference(x, positions, 500.0, layout == "interleaved"), rtol=1e-5, atol=1e-6)
    inv_freq = ops.rope_inv_freq(8, theta=500.0)
    np.testing.assert_allclose(inv_freq, 500.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6)
    with pytest.raises(microllm.ValueError, match="unknown layout"):
        ops.rope(T(x), T(positions), layout="sideways")


# ---- indexing, losses, reductions ----

def test_embedding(rng):
    weight = normal(rng, 10, 4)
    ids = rng.integers(0, 10, size=(2, 3)).astype(np.int32)
    close(ops.embedding(T(weight), T(ids)), weight[ids], rtol=0, atol=0)
    with pytest.raises(microllm.IndexError):
        ops.embedding(T(weight), T(np.array([10], dtype=np.int64)))


def test_concat_split_topk_scatter_add(rng):
    a, b = normal(rng, 2, 3), normal(rng, 2, 5)
    close(ops.concat([T(a), T(b)], dim=1), np.concatenate([a, b], axis=1), rtol=0, atol=0)
    joined = T(np.concatenate([a, b], axis=1))
    left, right = ops.split(joined, [3, 5], dim=1)
    assert left.shares_storage_with(joined) and right.shares_storage_with(joined)
    close(left, a, rtol=0, atol=0)
    close(right, b, rtol=0, atol=0)
    x = rng.permutation(40).astype(np.float32).reshape(4, 10)
    values, indices = ops.topk(T(x), 3)
    expected = np.argsort(-x, axis=-1)[:, :3]
    np.testing.assert_array_equal(np.asarray(indices), expected)
    close(values, np.take_along_axis(x, expected, -1), rtol=0, atol=0)
    base, src = normal(rng, 3, 4), normal(rng, 2, 4)
    index = rng.integers(0, 3, size=(2, 4)).astype(np.int64)
    expected = base.copy()
    for i in range(2):
        for j in range(4):
            expected[index[i, j], j] += src[i, j]
    close(ops.scatter_add(T(base), 0, T(index), T(src)), expected)


def test_cross_entropy(rng):
    logits = normal(rng, 6, 11, dtype=np.float64) * 3
    targets = rng.integers(0, 11, size=6).astype(np.int64)
    targets[2] = -100
    kept = targets != -100
    lse = np.log(np.exp(logits).sum(-1))
    expected = np.mean(lse[kept] - logits[np.arange(6), np.where(kept, targets, 0)][kept])
    loss = ops.cross_entropy(T(logits), T(targets))
    assert loss.shape == () and loss.dtype == "f64"
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(microllm.Error, match=r"\[cross_entropy\]"):
        ops.cross_entropy(T(logits), T(np.array([11] * 6, dtype=np.int64)))


def test_reductions(rng):
    x = normal(rng, 3, 4, 5)
    close(ops.sum(T(x)), np.float32(x.sum()), rtol=1e-5)
    close(ops.sum(T(x), dims=(0, 2)), x.sum(axis=(0, 2)), rtol=1e-5)
    close(ops.sum(T(x), dims=1, keepdim=True), x.sum(axis=1, keepdims=True), rtol=1e-5)
    close(ops.sum(T(x), keepdim=True), x.sum(keepdims=True), rtol=1e-5)
    close(ops.mean(T(x), dims=[2]), x.mean(axis=2), rtol=1e-5)
    close(ops.max(T(x)), np.float32(x.max()), rtol=0)
    close(ops.max(T(x), dim=1), x.max(axis=1), rtol=0)
    assert ops.argmax(T(x)).item() == int(np.argmax(x))
    np.testing.assert_array_equal(np.asarray(ops.argmax(T(x), dim=-1, keepdim=True)),
                                  np.argmax(x, axis=-1)[..., None])
    tensors = [T(normal(rng, 3)), T(normal(rng, 2, 2))]
    squares = [float((np.asarray(t).astype(np.float64) ** 2).sum()) for t in tensors]
    close(ops.sum_squares(tensors), np.array(squares, dtype=np.float32), rtol=1e-5)
    assert ops.global_norm(tensors).item() == pytest.approx(math.sqrt(sum(squares)), rel=1e-5)


def test_ops_run_from_threads_on_shared_numpy_memory(rng):
    # The GIL is released inside the ops: threads run them at once, and a tensor over a NumPy array dropped on
    # another thread releases the array without a deadlock.
    a, b = normal(rng, 64, 64), normal(rng, 64, 64)
    expected = a @ b
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(np.asarray(ops.matmul(microllm.from_numpy(a), microllm.from_numpy(b))))
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and len(results) == 80
    for result in results:
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)
