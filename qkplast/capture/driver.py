"""Capture the post-RoPE queries and keys that attention actually receives (thesis sections 4.1, 5.4).

This module is the orchestrator; each concern lives in its own module:

* :mod:`qkplast.capture.hooks` -- the attention function registered with transformers'
  attention interface: post-RoPE ``query``/``key`` before grouped-query
  repetition, exactly what the kernel receives (no modeling file is patched);
* :mod:`qkplast.capture.architecture` -- the probe forward that finds which layers reach the
  hook and which are eligible (full attention, section 4.1.3);
* :mod:`qkplast.capture.sampling` -- heads and positions (sections 4.1.2-4.1.3);
* :mod:`qkplast.capture.recorder` -- the per-window recorder (rows copied on the
  query's own device, NaN/Inf refused) and :class:`Capturer`;
* :mod:`qkplast.capture.kernel_guard` -- the guard against attention kernels whose memory
  grows as ``seq_len^2``;
* :mod:`qkplast.capture.resume` -- resumable per-document parts.

Every setting comes from one :class:`qkplast.options.CaptureOptions`, and the
capture's attrs record every field of it under its own name, resolved (``seq_len``,
``bucket_size``, ``dtype`` and ``device`` as used), plus the resolved
``commit`` of the model.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import xarray as xr

from qkplast.capture.corpus import Corpus, Document, WindowStats, describe_policy, iter_windows
from qkplast.capture.hooks import CAPTURE_ATTN, DELEGATES, UnsupportedModelError, capture_attn_name, register_capture_attention
from qkplast.capture.hooks import text_decoder
from qkplast.capture_format import CaptureError, save_capture
from qkplast.capture.architecture import SUPPORTED_FAMILIES, LayerInfo, ArchitectureSpec, inspect_model
from qkplast.options import CaptureOptions
from qkplast.progress import progress_bar
from qkplast._version import package_versions
from qkplast.capture.resume import PartStore, check_output, output_lock
from qkplast.capture.recorder import Capturer
from qkplast.capture.sampling import HeadPlan, sample_heads, sample_positions

__all__ = [
    "CAPTURE_ATTN",
    "DELEGATES",
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "LayerInfo",
    "ArchitectureSpec",
    "HeadPlan",
    "capture_attn_name",
    "register_capture_attention",
    "text_decoder",
    "inspect_model",
    "sample_heads",
    "sample_positions",
    "Capturer",
    "capture",
    "run_capture",
]

def capture(
    model,
    tokenizer,
    corpus: Corpus | Iterable[Document],
    out: str | os.PathLike | None = None,
    options: CaptureOptions = CaptureOptions(),
    *,
    overwrite: bool = False,
    progress: bool = True,
    model_info: dict | None = None,
) -> xr.Dataset:
    """Capture post-RoPE Q/K at sampled positions of sampled heads over a corpus (thesis 4.1).

    Parameters
    ----------
    model, tokenizer
        A loaded transformers model (eval mode) and its tokenizer.
    corpus : Corpus or iterable of Document
        Documents in a fixed order (see :mod:`qkplast.capture.corpus`); ``options.corpus`` is
        replaced by its spec in the attrs.
    out : path, optional
        Capture file to write; parts stream to ``OUT.parts/`` and a rerun with
        the same options resumes. Without ``out`` nothing is written.
    options : CaptureOptions
        Every setting: ``seq_len`` (None: the model's maximum, at most 131072),
        ``bucket_size`` (None: ``seq_len // 16``), sampling, ``docs``, ``attn``,
        ``short_docs``, ``allow_unverified``. ``model``, ``dtype`` and ``device``
        are taken from the model itself (and ``model_info``), which is what ran.
    overwrite : bool
        Replace an existing ``out`` and discard parts made with other options.
    progress : bool or "lines"
        Show progress (:func:`qkplast.progress.progress_bar`): on a terminal tqdm bars (overall with ETA, and
        per document over layers), elsewhere (a notebook, a log file) one summary line at the end; ``"lines"``:
        one plain line per window (:class:`ProgressLines`), for log files.
    model_info : dict, optional
        Provenance of the model (:attr:`qkplast.capture.models.LoadedModel.info`): name, revision, commit.

    Returns
    -------
    xarray.Dataset
        The capture (see :mod:`qkplast.capture_format`).

    Raises
    ------
    CaptureError
        Nothing captured, a non-finite vector (:class:`qkplast.capture.recorder.NonFiniteCaptureError`,
        finished documents' parts kept), or parts from other options.
    UnsupportedModelError, qkplast.capture.kernel_guard.KernelError, qkplast.capture.models.ModelError
        The model cannot be captured, its kernel would need ``seq_len^2`` memory, or ``seq_len`` is too long.
    FileExistsError, FileNotFoundError, PermissionError
        Output problems, detected before any model work.
    """

    out = None if out is None else Path(out)
    # one writer per output: a second capture into the same file is refused while this one runs (a kill
    # releases the lock), so parts and the final file are never written by two processes
    with output_lock(out):
        if out is not None:
            check_output(out, overwrite)
        return _capture(model, tokenizer, corpus, out, options, overwrite=overwrite, progress=progress,
                        model_info=model_info)


def _capture(model, tokenizer, corpus, out: Path | None, options: CaptureOptions, *, overwrite: bool, progress,
             model_info: dict | None, plan=None) -> xr.Dataset:
    """:func:`capture` once the output is locked and checked.

    With ``plan`` (the preflight of :func:`run_capture`, made from the same config, tokenizer and corpus) the
    window and the kernel were checked before the weights loaded, and the corpus was cut into its windows then:
    they are read from the plan, not cut again.
    """
    from qkplast.capture.models import check_seq_len

    info = _model_info(model, model_info)
    options = _resolved(options, model, corpus, info)
    if plan is None:
        check_seq_len(model.config, options.seq_len, rope_scaling=info.get("rope_scaling"))
    capturer = Capturer(
        model, heads=options.heads, seed=options.seed, attn=options.attn, allow_unverified=options.allow_unverified
    )
    if plan is None:
        capturer.check_kernel(options.seq_len)
    store = PartStore(out, _manifest(options, info, corpus), overwrite)
    if plan is None:
        stats = WindowStats()
        windows = iter_windows(corpus, tokenizer, options.seq_len, short_docs=options.short_docs, stats=stats)
    else:
        stats, windows = plan.window_stats, iter(plan.kept_windows)
    last = None  # the last window's piece goes straight into the capture file, its part only if that fails
    bars = progress is True
    lines = ProgressLines(options.docs, options.seq_len) if progress == "lines" else None
    with capturer, _bar(options.docs, "doc", "capture", bars) as overall:
        pieces = []
        for index, window in enumerate(itertools.islice(windows, options.docs)):
            piece = store.load(index, window.doc_id)
            if piece is None:
                piece = _capture_window(capturer, window, options, bars)
                if options.docs is None or index < options.docs - 1:
                    store.save(index, piece)
                else:
                    last = (index, piece)
                if lines is not None:
                    lines.done(index, window.doc_id)
            elif lines is not None:
                lines.reused(index)
            pieces.append(piece)
            overall.update(1)
    ds = _combine(pieces, options, stats, store)
    ds.attrs = _capture_attrs(options, info, capturer, corpus, stats, pieces)
    if out is not None:
        _write(ds, out, overwrite, store, last)
    return ds


def _write(ds: xr.Dataset, out: Path, overwrite: bool, store: PartStore, last) -> None:
    """The capture file, then the parts removed; if the file cannot be written, the last window's part is
    written (when it can be) so that a rerun recomputes nothing, and the error is raised."""
    try:
        save_capture(ds, out, overwrite=overwrite)
    except BaseException:
        if last is not None:
            try:
                store.save(*last)
            except OSError:
                pass  # the file's own error, raised below, is the one to report
        raise
    store.remove()


class ProgressLines:
    """Progress of a capture as plain lines on stderr, one per window: for log files (a SLURM job's), where a
    progress bar's carriage returns make one unreadable line.

    ``[capture] window 3 of 500 (doc-id): 13.4 s/window, ETA 1h50m`` -- the rate over the windows computed in
    this process (windows reused from parts are counted as done, not timed).
    """

    def __init__(self, total: int | None, seq_len: int):
        import time

        self.total, self.seq_len, self.clock = total, seq_len, time.perf_counter
        self.start, self.computed = self.clock(), 0

    def _say(self, text: str) -> None:
        import sys

        print(f"[capture] {text}", file=sys.stderr, flush=True)

    def reused(self, index: int) -> None:
        self._say(f"window {index + 1} of {self.total or '?'}: reused from its part")

    def done(self, index: int, doc_id: str) -> None:
        self.computed += 1
        rate = (self.clock() - self.start) / self.computed
        left = "" if self.total is None else f", ETA {_duration(rate * (self.total - index - 1))}"
        label = doc_id if len(doc_id) <= 40 else doc_id[:37] + "..."
        self._say(f"window {index + 1} of {self.total or '?'} ({label}, {self.seq_len} tokens): {rate:.1f} s/window{left}")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _bar(total, unit: str, desc: str, progress: bool, **kwargs):
    # a tqdm bar on a terminal; in a notebook or a log file one summary line (the nested per-window bars none)
    return progress_bar(total=total, unit=unit, desc=desc, enabled=progress, **kwargs)


def _model_info(model, model_info: dict | None) -> dict:
    info = dict(model_info or {})
    info.setdefault("model", getattr(model.config, "_name_or_path", "") or type(model).__name__)
    info.setdefault("revision", None)
    info.setdefault("commit", getattr(model.config, "_commit_hash", None))
    info.setdefault("rope_scaling", None)
    info["dtype"] = str(model.dtype).removeprefix("torch.")
    info["device"] = str(text_decoder(model).device)
    return info


def _resolved(options: CaptureOptions, model, corpus, info: dict) -> CaptureOptions:
    """``options`` with what actually runs: lengths resolved, model, revision, dtype, device and corpus as used."""
    from qkplast.capture.models import default_seq_len

    seq_len = options.seq_len or default_seq_len(model.config)
    bucket_size = options.bucket_size or max(1, seq_len // 16)
    if not 0 < options.samples_per_bucket <= bucket_size:
        raise CaptureError(
            f"samples_per_bucket must lie in (0, bucket_size={bucket_size}], got {options.samples_per_bucket}"
        )
    return replace(
        options,
        seq_len=seq_len,
        bucket_size=bucket_size,
        model=info["model"],
        revision=info["revision"],
        dtype=info["dtype"],
        device=info["device"],
        corpus=corpus.spec if isinstance(corpus, Corpus) else "in-memory documents",
    )


def _corpus_details(corpus) -> dict:
    return corpus.details if isinstance(corpus, Corpus) else {"kind": "in-memory"}


def _manifest(options: CaptureOptions, info: dict, corpus) -> dict:
    """What must match for a rerun to reuse parts: everything that can change what is captured."""
    model = {k: v for k, v in info.items() if k != "device"}
    return {"options": options.result_key(), "model": model, "corpus_details": _corpus_details(corpus),
            "versions": package_versions()}


def _capture_window(capturer: Capturer, window, options: CaptureOptions, progress: bool) -> xr.Dataset:
    """One document window: positions drawn, forward run (unless nothing was drawn), rows as a Dataset."""
    positions = sample_positions(
        options.seq_len,
        options.bucket_size,
        doc_id=window.doc_id,
        seed=options.seed,
        samples_per_bucket=options.samples_per_bucket,
        min_per_bucket=options.min_per_bucket,
    )
    plan, layout = capturer.plan, capturer.layout
    if positions.size:
        label = window.doc_id if len(window.doc_id) <= 40 else window.doc_id[:37] + "..."
        desc = f"{label} ({options.seq_len} tokens)"
        with _bar(capturer.calls_per_window, "layer", desc, progress, leave=False) as bar:
            q, k = capturer.capture_window(
                window.input_ids, positions, doc_id=window.doc_id, on_call=lambda: bar.update(1)
            )
    else:
        # No position drawn: the forward pass would record nothing, so it is skipped.
        q = k = np.zeros((len(plan), 0, layout.head_dim), dtype=np.float32)
    coords = {
        "position": ("sample", positions.astype(np.int64)),
        "doc": ("sample", np.array([window.doc_id] * len(positions), dtype=str)),
        "bucket": ("sample", (positions // options.bucket_size).astype(np.int64)),
        "token": ("sample", window.input_ids[positions].astype(np.int64)),
        "layer": ("head", plan.layer),
        "q_head": ("head", plan.q_head),
        "kv_head": ("head", plan.kv_head),
        "rope": ("head", plan.rope),
        "rotary": ("dim", layout.rotary_mask),
    }
    if layout.query_scale is not None:  # Ministral-3: the factor the kernel's queries carry at each position
        coords["query_scale"] = ("sample", layout.query_scale(positions))
    return xr.Dataset(
        {"q": (("head", "sample", "dim"), q), "k": (("head", "sample", "dim"), k)},
        coords=coords,
        attrs={"doc": window.doc_id, "parts": list(window.parts)},
    )


def _combine(pieces: list[xr.Dataset], options: CaptureOptions, stats: WindowStats, store: PartStore) -> xr.Dataset:
    """Concatenate the windows' samples; refuse an empty result, saying why it is empty."""
    if not pieces:
        store.remove()
        raise CaptureError(
            f"corpus {options.corpus!r} gave no window of {options.seq_len} tokens ({stats.documents_read} documents "
            f"read, {stats.empty_documents_skipped} empty, {stats.short_documents_skipped} short ones skipped, "
            f"{stats.short_documents_left_over} short ones left over); nothing was captured"
        )
    nonempty = [piece for piece in pieces if piece.sizes["sample"]]
    if not nonempty:
        raise CaptureError(
            f"no position was sampled in {len(pieces)} documents (keep probability "
            f"{options.samples_per_bucket}/{options.bucket_size}); capture more documents, raise samples_per_bucket "
            "or set min_per_bucket"
        )
    return xr.concat(nonempty, dim="sample", data_vars="all", coords="different", compat="equals", join="exact")


def _capture_attrs(options: CaptureOptions, info: dict, capturer: Capturer, corpus, stats, pieces) -> dict:
    """Every option under its own name (resolved), the commit, and what the capture found and did."""
    layout, plan = capturer.layout, capturer.plan
    text_config = capturer.model.config.get_text_config()
    composite = {p.attrs["doc"]: list(p.attrs["parts"]) for p in pieces if len(p.attrs["parts"]) > 1}
    return {
        **options.to_dict(),
        "commit": info.get("commit"),
        "tokenizer_commit": info.get("tokenizer_commit"),
        "model_info": info,
        "model_family": layout.family,
        "family_verified": layout.verified,
        "n_buckets": -(-options.seq_len // options.bucket_size),
        "corpus_details": _corpus_details(corpus),
        "n_docs": len(pieces),
        "short_docs_policy": describe_policy(options.short_docs),
        "window_stats": stats.as_dict(),
        "window_parts": composite,
        "n_q_heads": layout.n_q_heads,
        "n_kv_heads": layout.n_kv_heads,
        "head_dim": layout.head_dim,
        "n_layers": int(text_config.num_hidden_layers),
        "eligible_layers": layout.eligible_layers,
        "excluded_layers": layout.excluded(),
        "n_heads": len(plan),
        "heads_eligible": plan.n_eligible,
        "head_sampling": (
            "numpy.random.default_rng(seed).choice without replacement over (eligible layer, q_head) pairs in "
            "(layer, q_head) order, all if fewer than requested; kv_head = q_head // (n_q_heads / n_kv_heads)"
        ),
        "position_sampling": (
            "each position of [0, seq_len) kept with probability samples_per_bucket / bucket_size from "
            "numpy.random.default_rng(SeedSequence([seed, *uint32 words of sha256(doc id)])); buckets below "
            "min_per_bucket topped up uniformly without replacement; same positions for q and k"
        ),
        "capture_point": (
            "query/key as passed to the attention kernel: after projection, q/k norm and rotary embedding, "
            "before grouped-query repetition; rows copied to float32 on the CPU"
        ),
        "rotary_dims": int(layout.rotary_mask.sum()),
        "query_scale_rule": (
            None if layout.query_scale is None else
            "coordinate query_scale: the factor 1 + beta log(1 + floor(position / original_max_position_embeddings)) "
            "(rope_parameters llama_4_scaling_beta) that multiplies the queries after RoPE, in the model's dtype, "
            "and that the captured queries include; the keys carry no factor"
        ),
        "attn_implementation": f"{capturer.attn_name} (delegating to {capturer.attn})",
        "rope_parameters": getattr(text_config, "rope_parameters", None),
        "max_position_embeddings": int(text_config.max_position_embeddings),
        **package_versions(),
    }


def run_capture(
    options: CaptureOptions,
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
    loaded=None,
    plan=None,
) -> xr.Dataset:
    """Check everything that needs no weight (once), load the model (unless ``loaded``) and capture.

    Everything that can be checked without weights is checked first, in
    seconds: the output, then the preflight (:func:`qkplast.capture.plan.preflight`): the model name and
    revision (``owner/name@revision`` offline), ``seq_len`` against the (RoPE-scaled) config, the attention
    kernel (:mod:`qkplast.capture.kernel_guard`), and -- with only the tokenizer loaded -- that the corpus
    yields ``options.docs`` windows. The capture reads the windows the preflight cut.

    Parameters
    ----------
    options : CaptureOptions
        Every setting, ``model`` (``owner/name@revision`` accepted) included.
    out : path
        Capture file to write.
    overwrite, progress
        See :func:`capture`.
    loaded : qkplast.capture.models.LoadedModel, optional
        An already loaded model (one load per batch); its ``info`` must name the same model.
    plan : qkplast.capture.plan.CapturePlan, optional
        The preflight of ``options``, made by the caller before any weights loaded (``qkplast run`` makes one
        per capture); none of its checks is made again.
    """
    from qkplast.capture import corpus as corpus_module
    from qkplast.capture.models import load_for
    from qkplast.capture.plan import preflight

    out = Path(out)
    check_output(out, overwrite)
    if plan is not None:
        _check_plan(plan, options)
    documents = corpus_module.open_corpus_for(options) if plan is None else plan.corpus
    if loaded is not None and loaded.info.get("model") != options.model:
        raise CaptureError(f"the loaded model is {loaded.info.get('model')!r} but the options name {options.model!r}")
    if loaded is not None and loaded.info.get("tokenizer") != options.tokenizer:
        raise CaptureError(
            f"the loaded model carries tokenizer {loaded.info.get('tokenizer')!r} but the options name "
            f"{options.tokenizer!r}; load it with qkplast.capture.models.load_for(options)"
        )
    if plan is None:
        # no memory plan: a capture alone checks none (qkplast run and qkplast plan do)
        plan = preflight(options, documents, tokenizer=None if loaded is None else loaded.tokenizer,
                         memory=False)
    # the output was checked above: from here the lock keeps a second writer out while the weights load and the
    # windows are captured, so the check is not repeated under it
    with output_lock(out):
        if loaded is None:
            loaded = load_for(plan.options, plan=plan)
        return _capture(loaded.model, loaded.tokenizer, documents, out, plan.options, overwrite=overwrite,
                        progress=progress, model_info=loaded.info, plan=plan)


def _check_plan(plan, options: CaptureOptions) -> None:
    """Refuse a plan made for other options than ``options`` (lengths left to the model's config excepted)."""
    resolved = replace(options, seq_len=options.seq_len or plan.options.seq_len,
                       bucket_size=options.bucket_size or plan.options.bucket_size)
    if resolved != plan.options or plan.kept_windows is None:
        raise CaptureError("the plan passed to run_capture was made for other options (or is not a capture's "
                           "preflight); make it with qkplast.capture.plan.preflight(options)")
