"""What a computed product depends on beyond its settings: qkplast's code, the numerical libraries, the machine.

A product that is kept and read back (a run directory's cached products, :func:`qkplast.rundir.cached`; the
recapture of chapter 10 in qkplast's cache) is reused only while everything it was computed from is unchanged.
Its settings are the caller's; this module gives the rest, each as a JSON-able value:

* :func:`source_digest`: the sha256 of qkplast's modules (all of them, or the subpackages a product's code
  lives in and imports from), so that a change of that code computes the product again;
* :func:`library_versions`: the numerical libraries' versions;
* :func:`machine`: what decides a kernel's order of summation: the CPU (vendor, family, model, a hash of its
  flags), the kernels ATen dispatches to and the threads, or the GPU's name.

:func:`product_provenance` is the three together, the entry a cache key holds under ``"provenance"``.
:func:`content_digest` names a product's input data (a capture) by its bytes, for the keys of products computed
from data that a key of settings alone cannot name.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

__all__ = ["content_digest", "cpu", "library_versions", "machine", "product_provenance", "source_digest"]

_PACKAGE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def source_digest(*parts: str) -> str:
    """sha256 of qkplast's modules (relative path and bytes, in path order).

    ``parts`` are subpackages or modules of qkplast (``"analysis"``, ``"stats"``, ``"tensors.py"``); none: the
    whole package. A product's key names the layers its code lives in and the layers below them, so a change
    anywhere in them gives another key. Read once per process (the files of an imported package do not change
    under it).
    """
    digest = hashlib.sha256()
    roots = [_PACKAGE / part for part in parts] if parts else [_PACKAGE]
    modules = {p for root in roots for p in ([root] if root.is_file() else root.rglob("*.py"))}
    # a wheel's copies of the notebooks (qkplast/_shipped/notebooks/*.py) are not modules: an install from the
    # wheel has the checkout's digest
    for path in sorted(p for p in modules if "_shipped" not in p.relative_to(_PACKAGE).parts):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def cpu() -> dict:
    """The CPU as Linux names it (``/proc/cpuinfo``'s first processor): vendor, family, model, name and a hash of
    its flags (the instruction sets a BLAS picks its kernels by); the platform's name elsewhere."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block: every core of one machine is the same kind
                name, _, value = line.partition(":")
                fields[name.strip()] = value.strip()
    except OSError:
        pass
    found = {k: fields[k] for k in ("vendor_id", "cpu family", "model", "model name") if k in fields}
    if "flags" in fields:
        found["flags_sha256"] = hashlib.sha256(fields["flags"].encode()).hexdigest()[:16]
    return found or {"processor": platform.processor() or platform.machine()}


def machine(device: str = "cpu") -> dict:
    """What decides a float32 kernel's order of summation here: the CPU, the kernels ATen dispatches to, the
    threads; on a GPU its name."""
    import torch

    found = {"cpu": cpu(), "aten_capability": torch.backends.cpu.get_cpu_capability(),
             "threads": torch.get_num_threads(), "device": str(device)}
    if str(device).startswith("cuda"):
        found["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return found


@functools.lru_cache(maxsize=None)
def library_versions(names=("numpy", "scipy", "torch", "xarray", "transformers", "tokenizers")) -> dict:
    """The installed versions of the numerical libraries a product may depend on (None: not installed)."""
    from qkplast._version import package_versions

    return package_versions(names)


def product_provenance(*parts: str, device: str = "cpu") -> dict:
    """:func:`source_digest` of ``parts``, :func:`library_versions` and :func:`machine`: the entry of a cache key
    beside a product's settings."""
    return {"source_sha256": source_digest(*parts), "versions": library_versions(), "machine": machine(device)}


#: the variables of a capture that every analysis reads: the vectors and where each sample sits
CAPTURE_CONTENT = ("q", "k", "position", "doc", "bucket")


def content_digest(dataset, names=CAPTURE_CONTENT, attrs=("seq_len", "bucket_size")) -> str:
    """sha256 of a dataset's ``names`` (variables or coordinates: name, dtype, shape and bytes, in the given order)
    and of the ``attrs`` it has: the identity of a product's input data, for its cache key.

    A capture of the default run (270 heads) takes about 0.1 s; the result is the same for the same values, however
    the dataset was made (read from a file, cut from another, computed).
    """
    import json

    import numpy as np

    digest = hashlib.sha256()
    for name in names:
        values = np.ascontiguousarray(dataset[name].values)
        if values.dtype.kind in "OU":  # strings: their text, not the pointers or the padded width
            values = np.frombuffer(json.dumps(values.tolist()).encode(), dtype=np.uint8)
        digest.update(f"{name}\0{values.dtype.str}\0{values.shape}\0".encode())
        digest.update(memoryview(values).cast("B"))
    digest.update(json.dumps({a: str(dataset.attrs.get(a)) for a in attrs}, sort_keys=True).encode())
    return digest.hexdigest()
