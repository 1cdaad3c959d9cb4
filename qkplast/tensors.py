"""Device resolution, float64 tensors (every statistic in qkplast is computed in float64) and head chunks."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

T = TypeVar("T")

DTYPE = torch.float64


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` (or None) picks CUDA when present, else the CPU; anything else is passed to torch."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was asked for but torch sees no CUDA device")
    return device


def as_f64(x, device: torch.device) -> torch.Tensor:
    """A float64 tensor on ``device`` (from numpy, xarray or torch)."""
    if hasattr(x, "values") and not isinstance(x, torch.Tensor):
        x = x.values
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    return x.to(device=device, dtype=DTYPE)


def to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


#: CPU chunk budget (MB) of kernels whose large temporaries are :func:`scratch` buffers, reused chunk after chunk:
#: analyze() of 300 heads x 16 buckets x 256 pairs (d = 128) took 0.94 s in the 10-head chunks of this budget
#: against 1.10 s in the 2-head chunks of the 16 MB default, on 2 cores (best of 5, one run)
SCRATCH_CPU_MB = 64
#: CPU chunk budget (MB) of the passes that include the listwise plasticity (a dozen small operations per query
#: bucket and set size, per chunk, whatever the chunk's size): the default analyze() of the same workload took
#: 2.65-2.71 s in the 25-30-head chunks of this budget against 2.94-2.98 s in the 10-head chunks of
#: SCRATCH_CPU_MB (one run, interleaved); the thesis's metrics alone keep SCRATCH_CPU_MB
LISTWISE_CPU_MB = 192


def auto_chunk(bytes_per_head: float, device: torch.device, cpu_mb: int = 16) -> int:
    """Heads per chunk so the largest temporary stays near ``cpu_mb`` MB (CPU) or 1 GB (GPU).

    16 MB keeps freshly allocated temporaries below glibc's largest mmap
    threshold, so their memory is reused instead of mapped and zero-filled
    afresh; kernels whose large temporaries are :func:`scratch` buffers can
    afford more.
    """
    budget = 2**30 if device.type == "cuda" else cpu_mb * 2**20
    return max(1, int(budget // max(bytes_per_head, 1)))


def head_chunks(n_head: int, chunk: int | None):
    """Slices over the head axis, so memory stays bounded on large captures (0/None: all heads)."""
    chunk = n_head if not chunk else max(1, int(chunk))
    for start in range(0, n_head, chunk):
        yield slice(start, min(start + chunk, n_head))


_worker = threading.local()
_blas: list = []  # the process's one ThreadpoolController, made on first use


def blas_threads(n: int):
    """``threadpoolctl``'s limit on the BLAS threads as a context manager, from one controller per process: a
    fresh ``threadpool_limits`` scans the loaded libraries on every call (about 30 ms), which dominated the
    small analyses that jackknives and nulls repeat hundreds of times."""
    if not _blas:
        _blas.append(ThreadpoolController())
    return _blas[0].limit(limits=n, user_api="blas")


def map_head_chunks(fn: Callable[[slice], T], n_head: int, chunk: int, device: torch.device) -> list[T]:
    """``[fn(s) for s in head_chunks(n_head, chunk)]``, the chunks spread over the CPU's cores.

    The analyses are many small problems, one per head (a 128 x 128 ``eigh``, a
    few ``[pair, dim]`` passes), where torch's intra-op threads gain little and
    a batched ``eigh`` runs its matrices one after another on one thread. On
    the CPU the chunks therefore run in ``torch.get_num_threads()`` worker
    threads, each single-threaded, so every core works on its own chunk with
    its temporaries in its own cache (``benchmarks/bench_plasticity.py``
    measures the gain). On a GPU, inside a worker, or with one thread, the
    chunks run in order. Results keep the chunks' order; an exception in any
    chunk is raised here.
    """
    slices = list(head_chunks(n_head, chunk))
    workers = min(torch.get_num_threads(), n_head) if device.type == "cpu" else 1
    if getattr(_worker, "active", False):
        return [fn(s) for s in slices]
    if workers <= 1:
        _worker.scratch = {}
        try:
            # numpy's BLAS (see matmul) with as many threads as torch's
            with blas_threads(torch.get_num_threads()):
                return [fn(s) for s in slices]
        finally:
            del _worker.scratch
    if len(slices) < 2 * workers:  # too few chunks to keep every core busy: split them finer
        slices = list(head_chunks(n_head, -(-n_head // (2 * workers))))

    def start_worker():
        _worker.active, _worker.scratch = True, {}
        torch.set_num_threads(1)

    before = torch.get_num_threads()
    try:
        # numpy's BLAS (see matmul) one thread per worker as well: its own pool would serialise the workers' calls
        with blas_threads(1), ThreadPoolExecutor(workers, initializer=start_worker) as pool:
            return list(pool.map(fn, slices))
    finally:
        torch.set_num_threads(before)  # a worker's setting also reaches the process-wide BLAS


def scratch(name: str, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` (``dtype``, default ``like``'s, on ``like``'s device), reused chunk after chunk.

    Inside :func:`map_head_chunks` each thread keeps one tensor per name for
    as long as the map runs, so the analyses' largest temporaries (the key-pair
    differences are megabytes per head) are allocated once, not once per
    chunk: each fresh allocation of that size costs a page fault per 4 KB
    page, and worker threads' malloc arenas give such memory back to the
    system after every chunk. A result written to it is valid until the same
    thread asks for the same name again. Outside a map it is a plain
    ``torch.empty``.
    """
    dtype = dtype or like.dtype
    cache = getattr(_worker, "scratch", None)
    if cache is None:
        return torch.empty(shape, dtype=dtype, device=like.device)
    key = (name, dtype, like.device)
    buf = cache.get(key)
    if buf is None or buf.numel() < math.prod(shape):
        buf = cache[key] = torch.empty(math.prod(shape), dtype=dtype, device=like.device)
    return buf[: math.prod(shape)].view(shape)


def head_vectors(capture, sl: slice, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries and keys of the heads ``sl`` of a capture, as stored (float32 as captured), on ``device``."""
    return tuple(torch.from_numpy(np.ascontiguousarray(capture[name].values[sl])).to(device) for name in ("q", "k"))


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b`` with batch broadcasting (``torch.matmul``); on the CPU through numpy's BLAS.

    On this project's 2-core AMD EPYC machines numpy's OpenBLAS (which
    releases the GIL, so the workers of :func:`map_head_chunks` run it side
    by side) is faster than the MKL inside the torch CPU wheel on the
    analyses' products: 1.15-1.3x on the Monte Carlo scores
    ``[pair, dim] x [dim, query]`` in float64 and float32, and 1.7x on a
    scatter matrix ``x^T x`` of one buffer, which numpy computes with ``syrk``
    (half the multiplications of a general product). Operands should be views
    whose last two axes have one unit stride (BLAS layouts), as transposes of
    contiguous tensors are; both must have one dtype.
    """
    if a.device.type != "cpu":
        return torch.matmul(a, b, out=out)
    result = np.matmul(a.numpy(), b.numpy(), out=None if out is None else out.numpy())
    return out if out is not None else torch.from_numpy(result)


def einsum(equation: str, *operands: torch.Tensor) -> torch.Tensor:
    """``torch.einsum``; on the CPU numpy's, which sums the products of all its operands in one loop: a sum of
    products such as ``"...d,...d->..."`` reads its operands once and writes no temporary of their size."""
    if operands[0].device.type != "cpu":
        return torch.einsum(equation, *operands)
    return torch.from_numpy(np.einsum(equation, *(x.numpy() for x in operands)))


def sort_last(x: torch.Tensor) -> torch.Tensor:
    """``x`` sorted along its last axis, NaN last, as ``torch.sort(x, -1).values``.

    On the CPU numpy's sort, which is vectorised: about ten times ``torch.sort`` on float64 rows of 1e4-1e5
    values (the permutation nulls' quantiles), with the same sorted values. Elsewhere ``torch.sort`` on the device.
    """
    if x.device.type == "cpu":
        return torch.from_numpy(np.sort(x.detach().contiguous().numpy(), axis=-1))
    return torch.sort(x, dim=-1).values


def argsort_last(x: torch.Tensor) -> torch.Tensor:
    """The permutation that sorts ``x`` along its last axis (``torch.argsort(x, -1)``).

    On the CPU numpy's vectorised argsort (five times torch's on the permutation nulls' short rows of random
    keys). Ties may be ordered otherwise than by torch; keys drawn from a continuous distribution have none, so
    the permutation is the same. Elsewhere ``torch.argsort`` on the device.
    """
    if x.device.type == "cpu":
        return torch.from_numpy(np.argsort(x.detach().contiguous().numpy(), axis=-1))
    return torch.argsort(x, dim=-1)


def gram(x: torch.Tensor) -> torch.Tensor:
    """``x^T x`` ``[..., dim, dim]`` of ``x`` ``[..., sample, dim]`` (a scatter matrix when ``x`` is centred)."""
    return matmul(x.transpose(-1, -2), x)


def release_gpu_memory() -> None:
    """Hand the CUDA caching allocator's free blocks back to the driver (after collecting garbage).

    The analyses and the bootstrap run on the GPU when one is visible; the allocator keeps their freed
    blocks for reuse by this process. A notebook kernel started next (chapters 12 and 13 load the model)
    is another process, which would find that memory taken. A no-op without CUDA.
    """
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
