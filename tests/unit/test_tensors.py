"""Chunks of heads spread over the CPU's cores (qkplast.tensors.map_head_chunks)."""

import threading
import time

import pytest
import torch

from qkplast.tensors import head_chunks, map_head_chunks

CPU = torch.device("cpu")


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_results_keep_the_order_of_the_chunks_and_workers_are_single_threaded(two_threads):
    seen = []

    def fn(sl):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        time.sleep(0.02)  # long enough that the second worker takes chunks too
        return list(range(sl.start, sl.stop))

    out = map_head_chunks(fn, 23, 3, CPU)
    assert [i for part in out for i in part] == list(range(23))
    assert len({ident for ident, _ in seen}) == 2  # two workers shared the chunks
    assert {n for _, n in seen} == {1}
    assert torch.get_num_threads() == 2  # restored for the caller


def test_few_chunks_are_split_so_every_core_works(two_threads):
    sizes = [sl.stop - sl.start for sl in map_head_chunks(lambda sl: sl, 10, 10, CPU)]
    assert sum(sizes) == 10 and len(sizes) >= 2


def test_an_error_in_a_chunk_is_raised_and_threads_are_restored(two_threads):
    def fn(sl):
        if sl.start >= 6:
            raise ValueError(f"chunk at {sl.start}")
        return sl

    with pytest.raises(ValueError, match="chunk at"):
        map_head_chunks(fn, 12, 2, CPU)
    assert torch.get_num_threads() == 2


def test_nested_calls_and_one_thread_run_in_order(two_threads):
    def outer(sl):
        return map_head_chunks(lambda inner: threading.get_ident(), 4, 1, CPU)

    for idents in map_head_chunks(outer, 4, 2, CPU):
        assert len(set(idents)) == 1  # inside a worker: no second pool
    torch.set_num_threads(1)
    main = threading.get_ident()
    assert map_head_chunks(lambda sl: threading.get_ident(), 8, 2, CPU) == [main] * 4
    assert list(head_chunks(5, 2)) == [slice(0, 2), slice(2, 4), slice(4, 5)]


def test_scratch_is_reused_within_a_map_and_fresh_outside(two_threads):
    from qkplast.tensors import scratch

    like = torch.zeros(1, dtype=torch.float64)
    assert scratch("x", (3, 4), like).data_ptr() != scratch("x", (3, 4), like).data_ptr()  # outside: plain empty

    def fn(sl):
        a = scratch("x", (4, 5), like)
        b = scratch("x", (2, 5), like)  # smaller: a view of the same storage
        c = scratch("y", (4, 5), like)
        return a.data_ptr() == b.data_ptr() != c.data_ptr(), tuple(b.shape), b.dtype

    assert set(map_head_chunks(fn, 8, 1, CPU)) == {(True, (2, 5), torch.float64)}


def test_scratch_keeps_one_buffer_per_dtype(two_threads):
    from qkplast.tensors import scratch

    like = torch.zeros(1, dtype=torch.float64)

    def fn(sl):
        a, b = scratch("x", (4,), like), scratch("x", (4,), like, torch.float32)
        return a.dtype, b.dtype, a.data_ptr() != b.data_ptr()

    assert set(map_head_chunks(fn, 4, 1, CPU)) == {(torch.float64, torch.float32, True)}


def test_matmul_through_numpy_equals_torch():
    from qkplast.tensors import gram, matmul

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 5, 7, 6, generator=gen, dtype=torch.float64)
    b = torch.randn(3, 5, 6, 4, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(matmul(a, b), torch.matmul(a, b), rtol=1e-13, atol=0)
    torch.testing.assert_close(matmul(a, b[..., :1]), torch.matmul(a, b[..., :1]), rtol=1e-13, atol=0)  # gemv
    torch.testing.assert_close(matmul(b.transpose(-1, -2), a.transpose(-1, -2)),
                               torch.matmul(b.transpose(-1, -2), a.transpose(-1, -2)), rtol=1e-13, atol=0)  # views
    t, x = torch.randn(9, generator=gen, dtype=torch.float64), torch.randn(2, 9, 4, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(matmul(t, x), torch.matmul(t, x), rtol=1e-13, atol=0)  # 1-D @ batched: [2, 4]
    out = torch.empty(3, 5, 7, 4, dtype=torch.float64)
    assert matmul(a, b, out=out) is out and torch.equal(out, matmul(a, b))
    f = a.float()
    assert matmul(f, f.transpose(-1, -2)).dtype == torch.float32
    g = gram(x)  # x^T x of one buffer: numpy's syrk
    torch.testing.assert_close(g, x.transpose(1, 2) @ x, rtol=1e-13, atol=1e-15)
    assert torch.equal(g, g.transpose(1, 2))


def test_numpy_blas_runs_one_thread_per_worker_and_is_restored(two_threads):
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads():
        return {i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}

    before = blas_threads()
    assert before, "numpy's BLAS is not visible to threadpoolctl"
    seen = map_head_chunks(lambda sl: blas_threads(), 8, 2, CPU)
    assert all(s == {1} for s in seen)
    assert blas_threads() == before
    torch.set_num_threads(1)
    assert map_head_chunks(lambda sl: blas_threads(), 4, 2, CPU) == [{1}, {1}]  # one torch thread: one BLAS thread
