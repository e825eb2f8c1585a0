"""numbatc.attention_with_kvcache's user-facing layer without a GPU: the AttentionProblem that
reaches the kernel modules' ``launch`` (replaced here by a recorder) for contiguous and paged
caches, where dispatch sends it (decode kernel for seqlen_q <= 16, the portable kernel above,
never sm90_attention), host and int cache_seqlens, every validation error (shapes, dtypes,
page size, block table, cache_seqlens and block-table values), and that values are not read
while the stream captures a CUDA graph.  Fakes: tests/helpers/fake_arrays.py (its autouse
``no_gpu`` answers the device queries; the fake GPU is compute capability 9.0).  The kernels'
results: tests/emulation/test_attention_kvcache_emulated.py and
tests/gpu/test_attention_kvcache_gpu.py."""

import importlib

import numpy as np
import pytest

import numbatc
from numbatc import attention_api
from numbatc.kernels import dispatch, sm80_attention, sm80_decode_attention, sm90_attention
from tests.helpers.fake_arrays import FakeCuda, no_gpu  # noqa: F401  (no_gpu: autouse)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("NUMBATC_ATTN_KERNEL", "NUMBATC_ATTN_CONFIG", "NUMBATC_PRINT_CONFIG",
                "NUMBATC_DECODE_SPLITS"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def launched(monkeypatch):
    """The (module name, problem) of each launch of the three attention kernel modules."""
    calls = []
    for name in ("sm80_attention", "sm90_attention", "sm80_decode_attention"):
        kernels = importlib.import_module(f"numbatc.kernels.{name}")
        monkeypatch.setattr(kernels, "launch", lambda p, cfg, name=name: calls.append((name, p)))
    return calls


@pytest.fixture
def ints(monkeypatch):
    """Device int32 arrays as fakes whose values the checks read from a dict; ``ints(values)``
    makes one.  Host arrays copied to the device are recorded in ``ints.copied``."""
    held = {}
    copied = []
    monkeypatch.setattr(attention_api, "_read_back_later",
                        lambda cas, stream: lambda: [held[ca.ptr] for ca in cas])
    monkeypatch.setattr(attention_api, "_host_to_device",
                        lambda ca, host, stream: copied.append(host.copy()))

    def make(vals, dtype="int32", **kw):
        vals = np.array(vals)
        f = FakeCuda(vals.shape, dtype, **kw)
        held[f.ptr] = vals
        return f
    make.copied = copied
    return make


def qkv(b=3, sq=1, hq=8, hkv=2, d=64, cache=100, pages=None, page_size=16, dtype="float16"):
    """q and a contiguous (b, cache, hkv, d) cache, or ``pages`` pages of page_size rows."""
    kv = (b, cache, hkv, d) if pages is None else (pages, page_size, hkv, d)
    return FakeCuda((b, sq, hq, d), dtype), FakeCuda(kv, dtype), FakeCuda(kv, dtype)


# --- what reaches the kernels ------------------------------------------------------------------


def test_contiguous_cache_decode(launched, ints):
    q, k, v = qkv()
    out, lse = numbatc.attention_with_kvcache(q, k, v, ints([0, 1, 100]), causal=True,
                                              return_lse=True)
    ((name, p),) = launched
    assert name == "sm80_decode_attention"
    assert p.kv_cache and not p.paged and not p.varlen and p.causal
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv) == (3, 1, 100, 8, 2)
    assert p.cache_seqlens.shape == (3,) and p.lse.shape == lse.shape == (3, 8, 1)
    assert out.shape == (3, 1, 8, 64)
    assert sm80_decode_attention.declines(p) is None  # any capacity: lengths are on the device
    assert "KV-cache" in sm90_attention.unsupported(p)


def test_paged_cache_decode(launched, ints):
    q, k, v = qkv(pages=10)
    table = ints([[3, 1, -1, -1], [0, 9, 8, 7], [2, -1, -1, -1]])  # unused entries: anything
    numbatc.attention_with_kvcache(q, k, v, ints([17, 64, 16]), block_table=table)
    ((name, p),) = launched
    assert name == "sm80_decode_attention" and p.paged and p.kv_cache
    assert (p.page_size, p.seqlen_k) == (16, 64) and p.block_table.shape == (3, 4)
    cfg = sm80_decode_attention.choose(p)
    assert sm80_decode_attention.compiled(p, cfg)[1].paged


def test_prefill_runs_the_portable_kernel(launched, ints):
    q, k, v = qkv(sq=20, pages=10, page_size=256)
    numbatc.attention_with_kvcache(q, k, v, ints([20, 300, 2000]), block_table=ints(
        np.arange(24).reshape(3, 8) % 10), causal=True)
    ((name, p),) = launched
    # head_dim 64 on the fake 9.0 GPU: sm90_attention for numbatc.attention, not for a KV cache
    assert name == "sm80_attention" and p.seqlen_q == 20 and p.page_size == 256
    assert dispatch.choose_attention(p)[0] is sm80_attention
    var = sm80_attention.compiled(p, sm80_attention.choose(p))[1]
    assert var.kv_cache and var.paged and not var.varlen


def test_int_and_host_cache_seqlens_are_copied(launched, ints):
    q, k, v = qkv()
    numbatc.attention_with_kvcache(q, k, v, 7)
    numbatc.attention_with_kvcache(q, k, v, [1, 2, 3])
    q, k, v = qkv(pages=4)
    numbatc.attention_with_kvcache(q, k, v, np.array([16, 1, 0]),
                                   block_table=np.array([[1], [3], [-5]]))
    assert len(launched) == 3 and all(p.cache_seqlens.dtype == "int32" for _, p in launched)
    assert [c.tolist() for c in ints.copied] == [[7, 7, 7], [1, 2, 3], [16, 1, 0],
                                                 [[1], [3], [-5]]]
    assert launched[2][1].block_table.shape == (3, 1)


def test_empty_problems_launch_nothing(launched, ints):
    q, k, v = qkv(sq=0)
    out = numbatc.attention_with_kvcache(q, k, v, ints([1, 2, 3]))
    assert out.shape == (3, 0, 8, 64) and not launched
    q, k, v = qkv(b=0)
    numbatc.attention_with_kvcache(q, k, v, ints(np.zeros(0, np.int32)))
    assert not launched


def test_values_are_not_read_under_capture(launched, ints, monkeypatch):
    from numbatc import _capture

    monkeypatch.setattr(_capture, "is_capturing", lambda stream: True)
    monkeypatch.setattr(attention_api, "_read_back_later",
                        lambda cas, stream: pytest.fail("read back"))
    q, k, v = qkv(pages=2)
    numbatc.attention_with_kvcache(q, k, v, ints([10**6, -3, 5]), block_table=ints(
        [[7], [-1], [99]]))  # garbage: the kernels clamp it
    assert len(launched) == 1


# --- errors --------------------------------------------------------------------------------------


def test_page_sizes():
    for ps in (24, 8, 0):
        q, k, v = qkv(pages=4, page_size=ps)
        with pytest.raises(ValueError, match="page_size .* must be a positive multiple of 16"):
            numbatc.attention_with_kvcache(q, k, v, 1, block_table=np.zeros((3, 1), np.int32))


@pytest.mark.parametrize("make, err, msg", [
    (lambda: (FakeCuda((3, 1, 8, 64), "float16"), FakeCuda((3, 9, 2, 64), "float32"),
              FakeCuda((3, 9, 2, 64), "float32")), TypeError, "k_cache has dtype float32"),
    (lambda: (FakeCuda((3, 1, 8, 64), "float16"), FakeCuda((3, 9, 2, 64), "float16"),
              FakeCuda((3, 9, 2, 64), "int8")), TypeError, "v_cache has dtype int8"),
    (lambda: (FakeCuda((3, 8, 64), "float16"), *qkv()[1:]), ValueError, "q must be 4-D"),
    (lambda: (qkv()[0], FakeCuda((3, 100, 2, 64), "float16"), FakeCuda((3, 99, 2, 64), "float16")),
     ValueError, "k_cache and v_cache must have the same shape"),
    (lambda: qkv(hq=6, hkv=4), ValueError, r"heads_q \(6\) must be a multiple of heads_kv"),
    (lambda: (qkv(b=2)[0], *qkv(b=3)[1:]), ValueError, "q has batch 2 but k_cache"),
    (lambda: (FakeCuda((3, 1, 8, 64), "float16"), FakeCuda((3, 9, 2, 32), "float16"),
              FakeCuda((3, 9, 2, 32), "float16")), ValueError, "head_dim 64 but k and v"),
])
def test_bad_operands(make, err, msg):
    q, k, v = make()
    with pytest.raises(err, match=msg):
        numbatc.attention_with_kvcache(q, k, v, 1)


def test_bad_block_tables(ints):
    q, k, v = qkv(pages=10)
    with pytest.raises(TypeError, match="block_table must be int32"):
        numbatc.attention_with_kvcache(q, k, v, 1, block_table=ints([[1], [2], [3]], "int64"))
    with pytest.raises(ValueError, match=r"block_table must be 2-D \(batch, max_blocks_per_seq\)"):
        numbatc.attention_with_kvcache(q, k, v, 1, block_table=ints([1, 2, 3]))
    with pytest.raises(ValueError, match="block_table has 2 rows; it must have one per sequence"):
        numbatc.attention_with_kvcache(q, k, v, 1, block_table=ints([[1], [2]]))
    with pytest.raises(ValueError, match="block_table must have a contiguous last dimension"):
        numbatc.attention_with_kvcache(q, k, v, 1, block_table=FakeCuda((3, 2), "int32",
                                                                        strides=(4, 2)))
    with pytest.raises(ValueError, match="device"):
        numbatc.attention_with_kvcache(q, k, v, 1, block_table=ints([[1], [2], [3]], device=1))
    with pytest.raises(TypeError, match="block_table must hold integers"):
        numbatc.attention_with_kvcache(q, k, v, 1, block_table=np.ones((3, 1)))


@pytest.mark.parametrize("seqlens, table, msg", [
    ([16, 33, 0], [[0, -1, -1], [1, 2, 10], [-1, -1, -1]],
     r"block_table\[1, 2\] = 10 is not a page of k_cache \(0 .. 9\); sequence 1 uses its "
     r"first 3 entries"),
    ([17, 1, 0], [[0, -2, 5], [1, 2, 3], [4, 4, 4]], r"block_table\[0, 1\] = -2"),
    ([49, 1, 0], [[0, 1, 2], [3, 4, 5], [6, 7, 8]],
     r"cache_seqlens\[0\] = 49 is more keys than the pages block_table holds \(3 a sequence "
     r"x page_size 16\)"),
    ([1, -1, 0], [[0, 1, 2], [3, 4, 5], [6, 7, 8]], r"cache_seqlens\[1\] = -1 is negative"),
])
def test_bad_paged_values(launched, ints, seqlens, table, msg):
    """Device arrays are read back while the kernel runs (it clamps any value): the error
    comes after the launch; host arrays are checked before anything runs."""
    q, k, v = qkv(pages=10)
    with pytest.raises(ValueError, match=msg):  # device arrays read back
        numbatc.attention_with_kvcache(q, k, v, ints(seqlens), block_table=ints(table))
    assert len(launched) == 1
    with pytest.raises(ValueError, match=msg):  # host arrays: the same checks
        numbatc.attention_with_kvcache(q, k, v, np.array(seqlens), block_table=np.array(table))
    assert len(launched) == 1


def test_bad_cache_seqlens(launched, ints):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"cache_seqlens\[2\] = 101 is more keys than the "
                                         r"cache's seqlen_cache \(100\)"):
        numbatc.attention_with_kvcache(q, k, v, ints([0, 100, 101]))
    with pytest.raises(ValueError, match="more keys than"):
        numbatc.attention_with_kvcache(q, k, v, 101)
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        numbatc.attention_with_kvcache(q, k, v, ints([1, 2, 3], "int64"))
    with pytest.raises(ValueError, match=r"cache_seqlens must have shape \(batch,\) = \(3,\)"):
        numbatc.attention_with_kvcache(q, k, v, ints([1, 2]))
    with pytest.raises(ValueError, match="cache_seqlens must be 1-D"):
        numbatc.attention_with_kvcache(q, k, v, ints([[1, 2, 3]]))
    with pytest.raises(ValueError, match="cache_seqlens must be in 0"):
        numbatc.attention_with_kvcache(q, k, v, -1)
    with pytest.raises(TypeError, match="cache_seqlens must hold integers"):
        numbatc.attention_with_kvcache(q, k, v, [1.0, 2.0, 3.0])
    with pytest.raises(TypeError):
        numbatc.attention_with_kvcache(q, k, v, True)


def test_no_pages_means_no_keys(launched, ints):
    q, k, v = qkv(pages=0)
    numbatc.attention_with_kvcache(q, k, v, 0, block_table=np.zeros((3, 2), np.int32))
    assert launched[0][1].seqlen_k == 0
    with pytest.raises(ValueError, match=r"the pages of k_cache \(none\)"):
        numbatc.attention_with_kvcache(q, k, v, 1, block_table=np.zeros((3, 2), np.int32))
