"""microllm.Tensor: metadata, factories, views, and memory shared with NumPy (buffer protocol, __array__,
from_numpy) and through DLPack (NumPy, and torch where it is installed) without copies, with the lifetimes right."""
import gc
import sys
import weakref

import numpy as np
import pytest

import microllm

NUMPY_DTYPES = {
    "f32": np.float32, "f64": np.float64, "f16": np.float16,
    "i8": np.int8, "u8": np.uint8, "i32": np.int32, "i64": np.int64,
}


def address(array):
    return array.__array_interface__["data"][0]


@pytest.fixture
def rng():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"random seed: {seed}")  # shown by pytest when the test fails
    return np.random.default_rng(seed)


def random_array(rng, shape, dtype):
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True).astype(dtype)


# ---- metadata, factories, host access ----

def test_metadata_of_a_new_tensor():
    t = microllm.zeros((2, 3))
    assert t.shape == (2, 3)
    assert t.strides == (3, 1)
    assert t.dtype == "f32" == microllm.float32
    assert t.device == "cpu"
    assert (t.numel(), t.ndim, len(t), t.element_size(), t.nbytes) == (6, 2, 2, 4, 24)
    assert t.is_contiguous()
    assert not t.transpose(0, 1).is_contiguous()
    assert t.transpose(0, 1).strides == (1, 3)
    assert "tensor(" in repr(t) and "shape=[2, 3]" in repr(t) and "dtype=f32" in str(t)
    with pytest.raises(TypeError):
        len(microllm.zeros(()))


def test_factories():
    assert microllm.ones(4, dtype="i32").tolist() == [1, 1, 1, 1]
    assert microllm.full((2, 2), 2.5, dtype=np.float64).tolist() == [[2.5, 2.5], [2.5, 2.5]]
    assert microllm.full((1,), 3, dtype="bfloat16").dtype == "bf16"
    assert microllm.arange(5).tolist() == [0, 1, 2, 3, 4] and microllm.arange(5).dtype == "i64"
    assert microllm.arange(1, 2, 0.25).tolist() == [1.0, 1.25, 1.5, 1.75]
    assert microllm.arange(1, 2, 0.25).dtype == "f32"
    assert microllm.arange(0, 6, 2, dtype="i32").tolist() == [0, 2, 4]
    assert microllm.tensor([[1.5, 2.0]]).dtype == "f32"
    assert microllm.tensor([1, 2]).dtype == "i64"
    assert microllm.tensor([True, False]).tolist() == [1, 0]
    assert microllm.tensor([1, 2], dtype="f16").tolist() == [1.0, 2.0]
    assert microllm.tensor(3.0).shape == ()
    assert microllm.dtypes == ("f32", "f16", "bf16", "f64", "i8", "u8", "i32", "i64", "f8e4m3fn", "f8e5m2")
    with pytest.raises(microllm.ValueError, match="unknown dtype name 'f31'"):
        microllm.zeros(2, dtype="f31")
    with pytest.raises(microllm.ValueError, match="unknown device"):
        microllm.zeros(2, device="tpu")


def test_poisoned_empty_shows_nan():
    microllm.set_poison_new_allocations(True)
    try:
        assert np.isnan(np.asarray(microllm.empty((3,)))).all()
        assert microllm.empty((2,), dtype="i32").tolist() == [-1, -1]
    finally:
        microllm.set_poison_new_allocations(False)


def test_item_tolist_and_conversions():
    assert microllm.full((), 2.5).item() == 2.5
    assert isinstance(microllm.full((1, 1), 7, dtype="i64").item(), int)
    assert float(microllm.full((1,), 1.5)) == 1.5 and int(microllm.full((1,), 3, dtype="i32")) == 3
    with pytest.raises(microllm.ShapeError, match=r"\[item\].*has 2 elements"):
        microllm.zeros(2).item()
    t = microllm.arange(6).view(2, 3)
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert t.reshape((3, 2)).tolist() == [[0, 1], [2, 3], [4, 5]]
    assert list(microllm.arange(3)) and [x.item() for x in microllm.arange(3)] == [0, 1, 2]


def test_indexing_gives_views():
    t = microllm.arange(24).view(2, 3, 4)
    reference = np.arange(24).reshape(2, 3, 4)
    for index in [1, -1, (0, 2), (slice(None), 1), (Ellipsis, 2), (1, slice(0, 3, 2)), (None, 0),
                  (slice(1, None), Ellipsis, slice(None, None, 3))]:
        view = t[index]
        assert view.shares_storage_with(t)
        assert view.tolist() == reference[index].tolist(), index
    with pytest.raises(IndexError):
        t[2]
    with pytest.raises(IndexError, match="not positive"):
        t[::-1]


def test_to_and_copies():
    t = microllm.tensor([1.0, 2.5, -3.0])
    assert t.to("f32").shares_storage_with(t)
    assert not t.to("f32", copy=True).shares_storage_with(t)
    half = t.to(dtype="f16")
    assert half.dtype == "f16" and half.tolist() == [1.0, 2.5, -3.0]
    assert t.to(device="cpu", dtype="f64").dtype == "f64"
    assert not t.clone().shares_storage_with(t)
    view = microllm.arange(6).view(2, 3).t()
    assert view.contiguous().is_contiguous() and view.contiguous().tolist() == view.tolist()
    target = microllm.zeros((2, 3))
    target.copy_(microllm.tensor([1.0, 2.0, 3.0]))
    assert target.tolist() == [[1, 2, 3], [1, 2, 3]]


def test_bf16_values_through_f32():
    values = [1.0, -2.5, 0.15625, 2.0**15]
    t = microllm.tensor(values).to(dtype="bf16")
    assert t.dtype == "bf16" and t.element_size() == 2
    assert t.to(dtype="f32").tolist() == values  # all exactly representable in bf16
    assert microllm.tensor([1.0 + 2**-9]).to("bf16").to("f32").item() == 1.0  # rounded to 8 bits of mantissa


# ---- NumPy: the buffer protocol and __array__ ----

@pytest.mark.parametrize("name", list(NUMPY_DTYPES))
def test_numpy_round_trip_shares_memory(name, rng):
    array = random_array(rng, (3, 5), NUMPY_DTYPES[name])
    t = microllm.from_numpy(array)
    assert t.dtype == name and t.shape == (3, 5) and t.strides == (5, 1)
    assert t.data_ptr() == address(array)
    assert t.tolist() == array.tolist()
    back = np.asarray(t)
    assert back.dtype == array.dtype and address(back) == address(array)
    view = memoryview(t)
    assert view.shape == (3, 5) and view.strides == array.strides and view.itemsize == array.itemsize
    back[1, 2] = 7
    assert array[1, 2] == 7 and t[1, 2].item() == 7  # one memory, three names
    array[0, 0] = 5
    assert back[0, 0] == 5


@pytest.mark.parametrize("name", ["f32", "i64", "f16"])
def test_numpy_strided_views_are_shared(name, rng):
    array = random_array(rng, (4, 6), NUMPY_DTYPES[name])
    itemsize = array.itemsize
    for numpy_view in [array.T, array[:, ::2], array[1:3, 1::3], array[::2]]:
        t = microllm.from_numpy(numpy_view)
        assert t.data_ptr() == address(numpy_view)
        assert t.strides == tuple(s // itemsize for s in numpy_view.strides)
        assert t.tolist() == numpy_view.tolist()
        back = np.asarray(t)
        assert address(back) == address(numpy_view) and back.strides == numpy_view.strides
        np.testing.assert_array_equal(back, numpy_view)


def test_microllm_views_seen_by_numpy_without_copy(rng):
    array = random_array(rng, (4, 6), np.float32)
    t = microllm.tensor(array, copy=True)
    assert t.data_ptr() != address(array)
    cases = [(t.transpose(0, 1), array.T), (t[:, 1::2], array[:, 1::2]), (t.narrow(1, 2, 3), array[:, 2:5]),
             (t.select(0, 2), array[2]), (t.expand(3, 4, 6), np.broadcast_to(array, (3, 4, 6)))]
    for view, expected in cases:
        seen = np.asarray(view)
        assert address(seen) == view.data_ptr()
        assert seen.strides == tuple(s * 4 for s in view.strides)
        np.testing.assert_array_equal(seen, expected)
    np.asarray(t.transpose(0, 1))[5, 3] = 42.0  # written through the transposed view
    assert t[3, 5].item() == 42.0


def test_array_protocol_arguments(rng):
    array = random_array(rng, (2, 3), np.float32)
    t = microllm.from_numpy(array)
    assert address(t.__array__()) == address(array)
    assert address(t.numpy()) == address(array)
    copied = t.__array__(copy=True)
    assert address(copied) != address(array)
    np.testing.assert_array_equal(copied, array)
    converted = t.__array__(np.float64)
    assert converted.dtype == np.float64
    np.testing.assert_array_equal(converted, array.astype(np.float64))
    with pytest.raises(ValueError, match="copy=False"):
        t.__array__(np.float64, copy=False)
    bf16 = t.to("bf16")
    np.testing.assert_array_equal(bf16.__array__(np.float32), np.asarray(bf16.to("f32")))


@pytest.mark.parametrize("name", ["bf16", "f8e4m3fn", "f8e5m2"])
def test_dtypes_without_numpy_type_are_refused(name):
    t = microllm.ones((2,)).to(name)
    with pytest.raises(microllm.DTypeError, match=f"{name} has no NumPy dtype.*DLPack.*to\\(dtype=\"f32\"\\)"):
        np.asarray(t)
    with pytest.raises(BufferError, match=f"{name} has no NumPy dtype"):
        memoryview(t)


def test_from_numpy_refuses_what_it_cannot_share_and_tensor_copies_it(rng):
    array = random_array(rng, (4, 4), np.float32)
    read_only = array.copy()
    read_only.flags.writeable = False
    cases = [(read_only, microllm.ValueError, "read-only"),
             (array[::-1], microllm.ValueError, "negative"),
             (np.zeros(9, np.uint8)[1:].view(np.int32), microllm.ValueError, "aligned"),
             (array.astype(">f4"), microllm.ValueError, ">f4 is not f32"),
             (np.array([True, False]), microllm.ValueError, "bool is not u8"),
             (np.zeros(3, np.uint16), microllm.DTypeError, "uint16 has no microLLM dtype")]
    for source, error, message in cases:
        with pytest.raises(error, match=message):
            microllm.from_numpy(source)
    for source, _, _ in cases[:5]:
        t = microllm.tensor(source)
        assert t.tolist() == source.tolist()
        assert t.data_ptr() != address(source)
    with pytest.raises(microllm.ValueError, match="without a copy: it is read-only"):
        microllm.tensor(read_only, copy=False)
    with pytest.raises(TypeError):
        microllm.from_numpy([1, 2])


def test_tensor_shares_by_default_and_copies_on_request(rng):
    array = random_array(rng, (3,), np.float64)
    assert microllm.tensor(array).data_ptr() == address(array)
    assert microllm.tensor(array, copy=True).data_ptr() != address(array)
    as_f32 = microllm.tensor(array, dtype="f32")
    assert as_f32.dtype == "f32" and as_f32.data_ptr() != address(array)
    np.testing.assert_allclose(np.asarray(as_f32), array, rtol=1e-6)
    as_bf16 = microllm.tensor(array, dtype="bf16")
    np.testing.assert_allclose(np.asarray(as_bf16.to("f32")), array, rtol=2**-8)
    t = microllm.tensor(array)
    assert microllm.tensor(t).shares_storage_with(t)
    assert not microllm.tensor(t, copy=True).shares_storage_with(t)


# ---- lifetimes ----

def test_tensor_keeps_the_array_alive_and_releases_it(rng):
    array = random_array(rng, (1000,), np.float32)
    expected = array.copy()
    array_ref = weakref.ref(array)
    t = microllm.from_numpy(array)
    view = t[10:20]
    del array
    gc.collect()
    assert array_ref() is not None
    np.testing.assert_array_equal(np.asarray(t), expected)
    del t
    gc.collect()
    assert array_ref() is not None  # the view holds the storage
    np.testing.assert_array_equal(np.asarray(view), expected[10:20])
    del view
    gc.collect()
    assert array_ref() is None


def test_numpy_view_keeps_the_tensor_alive():
    t = microllm.arange(100, dtype="f32")
    seen = np.asarray(t[50:])
    del t
    gc.collect()
    np.testing.assert_array_equal(seen, np.arange(50, 100, dtype=np.float32))


# ---- DLPack ----

def test_dlpack_device():
    assert microllm.zeros(1).__dlpack_device__() == (1, 0)


@pytest.mark.parametrize("name", list(NUMPY_DTYPES))
def test_dlpack_round_trip_with_numpy(name, rng):
    array = random_array(rng, (3, 4), NUMPY_DTYPES[name])
    t = microllm.from_dlpack(array)
    assert t.dtype == name and t.data_ptr() == address(array)
    assert t.tolist() == array.tolist()
    back = np.from_dlpack(t)  # NumPy marks arrays it imports read-only
    assert address(back) == address(array)
    array[2, 3] = 9
    assert back[2, 3] == 9 and t[2, 3].item() == 9
    transposed = np.from_dlpack(t.transpose(0, 1))
    assert address(transposed) == address(array) and transposed.strides == array.T.strides
    np.testing.assert_array_equal(transposed, array.T)
    strided = microllm.from_dlpack(array[:, ::3])
    assert strided.data_ptr() == address(array) and strided.tolist() == array[:, ::3].tolist()


def test_dlpack_releases_the_producer_exactly_once(rng):
    array = random_array(rng, (16,), np.float32)
    references = sys.getrefcount(array)
    t = microllm.from_dlpack(array)
    assert sys.getrefcount(array) > references
    view = t[4:]
    del t
    gc.collect()
    assert sys.getrefcount(array) > references
    del view
    gc.collect()
    assert sys.getrefcount(array) == references  # a double release would go below, a leak stay above
    capsule = array.__dlpack__()
    del capsule  # never consumed: its own destructor releases it
    gc.collect()
    assert sys.getrefcount(array) == references


def test_exported_capsule_outlives_the_tensor(rng):
    array = random_array(rng, (5,), np.float32)
    t = microllm.tensor(array, copy=True)
    capsule = t.__dlpack__()
    del t
    gc.collect()
    u = microllm.from_dlpack(capsule)
    assert u.tolist() == array.tolist()
    with pytest.raises(microllm.ValueError, match="consumed already"):
        microllm.from_dlpack(capsule)
    unused = microllm.ones(3).__dlpack__()  # collected unconsumed: the export is freed by the capsule
    del unused
    gc.collect()
    with pytest.raises(TypeError, match="__dlpack__"):
        microllm.from_dlpack([1, 2])


def test_bf16_through_dlpack(rng):
    values = rng.standard_normal(6).astype(np.float32)
    t = microllm.tensor(values).to(dtype="bf16")
    shared = microllm.from_dlpack(t)
    assert shared.dtype == "bf16" and shared.data_ptr() == t.data_ptr()
    rounded = np.asarray(t.to("f32"))
    np.testing.assert_allclose(rounded, values, rtol=2**-8)
    np.testing.assert_array_equal(np.asarray(shared.to("f32")), rounded)
    with pytest.raises(microllm.DTypeError, match="f8e4m3fn has no DLPack"):
        microllm.ones(2).to("f8e4m3fn").__dlpack__()


# ---- torch (skipped where it is not installed) ----

def torch_devices():
    torch = pytest.importorskip("torch")
    devices = ["cpu"]
    if torch.cuda.is_available() and microllm.cuda_available():
        devices.append("cuda")
    return devices


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "i64"])
def test_torch_dlpack_both_ways(device, dtype):
    torch = pytest.importorskip("torch")
    if device not in torch_devices():
        pytest.skip("no CUDA device for both torch and microLLM")
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "i64": torch.int64}[dtype]
    t = microllm.arange(12, dtype="f32", device=device).to(dtype=dtype).view(3, 4)
    seen = torch.from_dlpack(t)
    assert seen.data_ptr() == t.data_ptr() and seen.dtype == torch_dtype and seen.device.type == device
    assert seen.float().cpu().tolist() == t.to("f32").tolist()
    strided = torch.from_dlpack(t.transpose(0, 1))
    assert strided.data_ptr() == t.data_ptr() and strided.stride() == (1, 4)
    source = torch.arange(20, device=device).to(torch_dtype).reshape(4, 5)
    back = microllm.from_dlpack(source)
    assert back.data_ptr() == source.data_ptr() and back.dtype == dtype and back.device.startswith(device)
    assert back.to(device="cpu", dtype="f32").tolist() == source.float().cpu().tolist()
    source.add_(1)  # torch's write, microLLM's read
    assert back.to(device="cpu", dtype="f32").tolist() == source.float().cpu().tolist()
    assert microllm.tensor(source).data_ptr() == source.data_ptr()
    del source
    gc.collect()
    assert back.to(device="cpu", dtype="f32").tolist()[0][:2] == [1.0, 2.0]
