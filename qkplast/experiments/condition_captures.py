"""What drives content decay (thesis 7.6): captures under controlled conditions and the reseeded null.

The thesis names three candidate mechanisms for the AP_drop left after bias
collapse (RoPE rotation accumulation, attention-sink competition,
representational drift) and the experiments that would separate them: vary
the RoPE parameters, the context length and the presence of initial tokens.
Each condition here is a capture of the same documents, decomposed with
:mod:`qkplast.analysis.decompose`:

``baseline``         windows of ``seq_len`` tokens from each document's start
``rope_xF``          RoPE base multiplied by F at inference (:func:`rope_base_scaled`; no training)
``window_L``         windows of L tokens (``bucket_size = L // 16`` keeps 16 buckets)
``bos``              a BOS token in front of each window
``mid_document``     windows cut ``offset`` tokens into each document (no document start)
``mask_first_k``     the first k keys masked in every attention call (:func:`first_keys_masked`)
``all_positions``    the baseline at every position: the source of the null

The null: what the decomposition's parts do with no intervention at all. The baseline with other sampled
positions is cut, for many seeds, from the capture of the baseline at every position (:func:`reseeded_captures`:
exactly the captures a new seed would take, one forward pass for all of them; :func:`reseed_null` their parts
minus the baseline's). The readings (the paired intervals over documents, each condition's difference ranked
among the reseeded differences with Holm's correction, the parts described beside the null, the mechanism
reading) are :mod:`qkplast.stats.condition_readings`.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr

from qkplast.capture.hooks import attention_transform
from qkplast.capture_format import validate_capture
from qkplast.options import AnalysisOptions, CaptureOptions
from qkplast.rundir import cached
from qkplast.stats.condition_readings import QUANTITIES

#: Version of the condition captures cached under ``RUN/conditions/``: bump it when a condition's capture
#: changes, so a run recomputes it instead of reusing a stale one.
SCHEMA_VERSION = 2


# --------------------------------------------------------------------------- interventions


@contextlib.contextmanager
def rope_base_scaled(model, factor: float):
    """Multiply the RoPE base of every rotary embedding of ``model`` by ``factor`` while open.

    With ``inv_freq_i = base^(-i/n)`` (``n`` frequencies), a base ``factor * base``
    gives ``inv_freq_i * factor^(-i/n)``: the buffers ``inv_freq`` (and
    ``original_inv_freq``) are rescaled in place and restored on exit. For the
    default RoPE this is exactly the model with ``rope_theta * factor``; for
    scaled variants (llama3, YaRN) it scales their already-modified frequencies
    the same way. No model file or config is changed.
    """
    if factor <= 0:
        raise ValueError(f"the RoPE base factor must be positive, got {factor}")
    saved = []
    for module in model.modules():
        for name in ("inv_freq", "original_inv_freq"):
            buf = getattr(module, name, None)
            if isinstance(buf, torch.Tensor):
                saved.append((module, name, buf.clone()))
    if not saved:
        raise ValueError("the model has no rotary inv_freq buffer to rescale (not a RoPE model?)")
    try:
        for module, name, buf in saved:
            n = buf.shape[-1]
            exponent = torch.arange(n, dtype=torch.float64, device=buf.device) / n
            getattr(module, name).copy_((buf.double() * float(factor) ** (-exponent)).to(buf.dtype))
        yield
    finally:
        for module, name, buf in saved:
            getattr(module, name).copy_(buf)


def first_keys_mask(seq_len: int, k: int, device=None) -> torch.Tensor:
    """Boolean attention mask ``[1, 1, seq, seq]`` (True = attend): causal, keys ``< k`` hidden from queries ``>= k``.

    Queries ``< k`` keep their causal keys, so every row has at least one key (its own).
    """
    i = torch.arange(seq_len, device=device)
    causal = i[None, :] <= i[:, None]  # [query, key]
    hidden = (i[None, :] < k) & (i[:, None] >= k)
    return (causal & ~hidden)[None, None]


@contextlib.contextmanager
def first_keys_masked(model, k: int, delegate: str = "sdpa"):
    """Mask the first ``k`` keys in every attention call of ``model`` (through :func:`qkplast.capture.hooks.attention_transform`)."""
    if k < 1:
        raise ValueError(f"the number of masked first keys must be >= 1, got {k}")
    cache: dict = {}

    def transform(module, query, key, value, attention_mask, kwargs):
        n_q, n_k = query.shape[2], key.shape[2]
        if n_q != n_k:
            raise ValueError("first_keys_masked supports full-sequence forwards only (no KV cache)")
        shape = (n_k, query.device)
        if shape not in cache:
            cache[shape] = first_keys_mask(n_k, k, query.device)
        mine = cache[shape]
        if attention_mask is None:
            return query, key, value, mine
        if attention_mask.dtype == torch.bool:
            return query, key, value, attention_mask & mine
        return query, key, value, attention_mask.masked_fill(~mine, torch.finfo(attention_mask.dtype).min)

    with attention_transform(model, transform, delegate=delegate):
        yield


# --------------------------------------------------------------------------- documents


def select_documents(corpus, tokenizer, n_docs: int, min_tokens: int):
    """The first ``n_docs`` documents of at least ``min_tokens`` tokens, as token lists ``{id: tokens}``."""
    from qkplast.capture.corpus import encode_text

    out = {}
    for doc in corpus:
        tokens = encode_text(tokenizer, doc.text) if doc.text.strip() else []
        if len(tokens) >= min_tokens:
            out[doc.id] = tokens
            if len(out) == n_docs:
                return out
    raise ValueError(f"the corpus has only {len(out)} documents of at least {min_tokens} tokens, {n_docs} were asked; "
                     "lower docs, seq_len, the window lengths or the mid-document offset, or use a longer corpus")


def _documents(tokens: dict, tokenizer, start: int, prefix: str = ""):
    from qkplast.capture.corpus import Document

    return [Document(doc_id, prefix + tokenizer.decode(t[start:])) for doc_id, t in tokens.items()]


# --------------------------------------------------------------------------- captures


def condition_grid(seq_len: int, rope_factors, window_lengths, sinks, mask_k: int, offset: int) -> dict[str, dict]:
    """Content-decay condition name -> its settings (``seq_len``, ``rope``, ``start``, ``bos``, ``mask_k``, ``all_positions``).

    ``all_positions`` is the baseline captured at every position of every bucket, from which
    :func:`reseeded_captures` cuts the baseline as any other seed would sample it: the null.
    """
    base = {"seq_len": seq_len, "rope": 1.0, "start": 0, "bos": False, "mask_k": 0, "all_positions": False}
    grid = {"baseline": base, "all_positions": {**base, "all_positions": True}}
    for f in rope_factors:
        grid[f"rope_x{f:g}"] = {**base, "rope": float(f)}
    for L in window_lengths:
        if L != seq_len:
            grid[f"window_{L}"] = {**base, "seq_len": int(L)}
    for s in sinks:
        if s == "bos":
            grid["bos"] = {**base, "bos": True}
        elif s == "mid_document":
            grid["mid_document"] = {**base, "start": int(offset)}
        elif s == "mask_first":
            grid[f"mask_first_{mask_k}"] = {**base, "mask_k": int(mask_k)}
        else:
            raise ValueError(f"unknown sink condition {s!r}; choose from 'bos', 'mid_document', 'mask_first'")
    return grid


def capture_conditions(run_dir: str | os.PathLike, capture: CaptureOptions | None = None, *, docs: int = 6,
                       seq_len: int = 1024, rope_factors=(0.5, 2.0, 4.0), window_lengths=(1024, 2048),
                       sinks=("bos", "mid_document", "mask_first"), mask_k: int = 4, offset: int | None = None,
                       samples_per_bucket: float = 8, heads: int | None = 300, progress: bool = False,
                       reuse: xr.Dataset | None = None, baseline_from_all_positions: bool = True
                       ) -> tuple[dict[str, xr.Dataset], dict]:
    """Capture every condition of :func:`condition_grid` on the same documents (cached under ``RUN/conditions/``).

    ``capture`` is the run's capture settings, passed whole: the model (with
    its revision and RoPE scaling), corpus, device, dtype and seed of every
    condition come from it; the window, documents, samples and heads of the
    conditions are the keywords.

    Returns the captures by condition name and the capture seconds of each
    (0 for a cached or reused one). Every condition uses the first ``docs``
    documents long enough for the longest window and for the mid-document cut,
    one document per window (no concatenation), ``bucket_size = window // 16``.

    ``reuse`` is a capture already made (the run's own): a condition with no
    intervention whose window, buckets, samples, seed, model and corpus equal
    its settings is cut from it (the same heads, documents and positions a new
    capture would take; the tokens are checked) instead of a forward pass.

    With ``baseline_from_all_positions`` the baseline is cut from the capture at every position (the null's
    source, captured anyway) at the positions its seed samples (:func:`cut_at_seed`): the values a capture
    of its own holds, one forward pass fewer.
    """
    from qkplast.capture.corpus import open_corpus_for
    from qkplast.capture.models import load_for, quiet_transformers

    run = capture or CaptureOptions()
    offset = seq_len // 2 if offset is None else int(offset)
    grid = condition_grid(seq_len, rope_factors, window_lengths, sinks, mask_k, offset)
    seed = run.seed
    settings = {"model": run.model, "revision": run.revision, "rope_scaling": run.rope_scaling, "corpus": run.corpus,
                "docs": docs, "samples_per_bucket": samples_per_bucket, "heads": heads, "seed": seed, "dtype": run.dtype}
    if run.tokenizer is not None:  # only when set, so the cache keys of runs with the model's own stay as they were
        settings["tokenizer"] = run.tokenizer
    folder = Path(run_dir) / "conditions"
    max_len = max(c["seq_len"] + c["start"] for c in grid.values())
    model = {}  # loaded on the first condition that is neither cached nor cut from ``reuse``

    def make(name: str, spec: dict) -> xr.Dataset:
        if not model:
            model["loaded"] = load_for(run)
            need = max_len + 16  # margin: decode + re-encode may merge a few tokens
            model["tokens"] = select_documents(open_corpus_for(run), model["loaded"].tokenizer, docs, need)
        loaded, tokens = model["loaded"], model["tokens"]
        resolved = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")  # "auto" as loaded
        cut = _cut_from(reuse, spec, {**settings, "dtype": resolved}, tokens)
        if cut is None and name == "baseline" and baseline_from_all_positions and "all_positions" in grid:
            full = get("all_positions")
            cut = cut_at_seed(full, seed, dict(full.attrs, samples_per_bucket=float(samples_per_bucket),
                                                cut_from="all_positions", capture_seconds=0.0))
        if cut is not None:
            cut.attrs["condition"], cut.attrs["condition_settings"] = name, spec
            return validate_capture(cut)
        t0 = time.perf_counter()
        cap = _condition_capture(loaded, tokens, spec, replace(run, heads=heads, seed=seed, docs=docs, short_docs="skip",
                                                               min_per_bucket=0), samples_per_bucket, progress)
        cap.attrs.update(condition=name, condition_settings=spec, capture_seconds=round(time.perf_counter() - t0, 2))
        return validate_capture(cap)

    out, seconds = {}, {}

    def get(name: str) -> xr.Dataset:
        """The condition's capture: from ``out``, the cache, or made (and cached)."""
        if name not in out:
            made, spec = [], grid[name]
            key = {**settings, **spec, "max_len": max_len, "schema": SCHEMA_VERSION}
            out[name] = validate_capture(cached(folder, name, key, lambda: made.append(name) or make(name, spec)))
            seconds[name] = float(out[name].attrs.get("capture_seconds", 0.0)) if made else 0.0
        return out[name]

    with quiet_transformers():  # weight-loading bars would make the notebook output machine-dependent
        for name in grid:
            get(name)
    return {name: out[name] for name in grid}, {name: seconds[name] for name in grid}


def _condition_capture(loaded, tokens: dict, spec: dict, base: CaptureOptions, samples_per_bucket: float,
                       progress: bool) -> xr.Dataset:
    """One condition's capture: its documents (start, BOS), its RoPE base and key mask applied while capturing."""
    from qkplast.capture.driver import capture as capture_into

    prefix = loaded.tokenizer.bos_token if spec["bos"] else ""
    if spec["bos"] and not prefix:
        raise ValueError(f"the tokenizer of {base.model} has no BOS token; drop 'bos' from the sink conditions")
    documents = _documents(tokens, loaded.tokenizer, spec["start"], prefix)
    with contextlib.ExitStack() as stack:
        if spec["rope"] != 1.0:
            stack.enter_context(rope_base_scaled(loaded.model, spec["rope"]))
        if spec["mask_k"]:
            stack.enter_context(first_keys_masked(loaded.model, spec["mask_k"]))
        bucket = spec["seq_len"] // 16
        options = replace(base, seq_len=spec["seq_len"], bucket_size=bucket,
                          samples_per_bucket=float(bucket) if spec["all_positions"] else samples_per_bucket)
        cap = capture_into(loaded.model, loaded.tokenizer, documents, None, options, progress=progress,
                           model_info=loaded.info)
    if spec["mask_k"]:  # masked keys cannot win: they leave the analysis as keys (and as queries)
        cap = cap.isel(sample=np.flatnonzero(cap.position.values >= spec["mask_k"]))
    return cap


def _cut_from(reuse: xr.Dataset | None, spec: dict, settings: dict, tokens: dict) -> xr.Dataset | None:
    """``reuse`` restricted to what a capture of condition ``spec`` would hold, or None when it cannot stand in.

    A capture is deterministic given its settings (heads drawn by
    :func:`qkplast.capture.sampling.chosen_heads`, positions seeded per document), so a
    capture of every head with the same window, buckets, samples and seed holds
    the condition's capture as a subset. The tokens at the sampled positions are
    compared with the condition's documents, which guards against a corpus read
    or tokenised differently.
    """
    from qkplast.capture.sampling import chosen_heads

    if reuse is None or spec["rope"] != 1.0 or spec["start"] or spec["bos"] or spec["mask_k"] or spec["all_positions"]:
        return None
    a = reuse.attrs
    same = (a.get("model") == settings["model"] and a.get("corpus") == settings["corpus"]
            and a.get("revision") == settings["revision"] and a.get("rope_scaling") == settings["rope_scaling"]
            and a.get("tokenizer") == settings.get("tokenizer")
            and str(a.get("dtype")) == str(settings["dtype"]) and int(a["seq_len"]) == spec["seq_len"]
            and int(a["bucket_size"]) == spec["seq_len"] // 16
            and float(a["samples_per_bucket"]) == float(settings["samples_per_bucket"])
            and int(a["seed"]) == settings["seed"]
            and int(a.get("heads_eligible", -1)) == reuse.sizes["head"])
    if not same:
        return None
    doc_ids = list(tokens)
    keep = np.isin(reuse.doc.values, doc_ids)
    if list(dict.fromkeys(reuse.doc.values[keep])) != doc_ids:
        return None
    cut = reuse.isel(head=chosen_heads(reuse.sizes["head"], settings["heads"], settings["seed"]),
                     sample=np.flatnonzero(keep))
    expected = [tokens[d][p] if p < len(tokens[d]) else -1 for d, p in zip(cut.doc.values, cut.position.values)]
    if not np.array_equal(np.asarray(expected), cut.token.values):
        return None
    cut = cut.copy()
    cut.attrs.update(docs=len(doc_ids), n_docs=len(doc_ids), heads=settings["heads"], cut_from="the run's capture")
    return cut


# --------------------------------------------------------------------------- the reseeded null


def reseeded_captures(all_positions: xr.Dataset, baseline: xr.Dataset, seeds) -> list[xr.Dataset]:
    """The baseline as captures with other position seeds, cut from the capture at every position.

    A capture keeps each token with probability ``samples_per_bucket / bucket_size``, seeded by the seed
    and the document id (:func:`qkplast.capture.sampling.sample_positions`), and the vectors at a position
    do not depend on which others are kept; so cutting the every-position capture at the positions seed
    ``s`` samples gives the capture with seed ``s``, heads and documents unchanged (the tests check the
    baseline's own seed gives the baseline).
    """
    return [cut_at_seed(all_positions, int(s), dict(baseline.attrs, reseeded_from="all_positions")) for s in seeds]


def cut_at_seed(all_positions: xr.Dataset, seed: int, attrs: dict) -> xr.Dataset:
    """The capture that position seed ``seed`` takes, cut from the capture at every position.

    ``attrs`` are the cut's attributes (its ``seq_len``, ``bucket_size`` and ``samples_per_bucket`` say
    which positions a capture keeps; ``seed`` is set to ``seed``). See :func:`reseeded_captures`.
    """
    cut = all_positions.isel(sample=np.flatnonzero(seed_keep(all_positions, seed, attrs)))
    cut.attrs = dict(attrs, seed=seed)
    return cut


def seed_keep(all_positions: xr.Dataset, seed: int, attrs: dict) -> np.ndarray:
    """The samples ``[sample]`` (booleans) of the capture at every position that position seed ``seed`` keeps, for
    a capture with ``attrs``' ``seq_len``, ``bucket_size`` and ``samples_per_bucket`` (:func:`cut_at_seed`)."""
    from qkplast.capture.sampling import sample_positions

    seq_len, bucket = int(attrs["seq_len"]), int(attrs["bucket_size"])
    pos, doc = all_positions.position.values, all_positions.doc.values
    keep = np.zeros(all_positions.sizes["sample"], dtype=bool)
    for d in np.unique(doc):  # documents only: each has its own seeded positions
        chosen = sample_positions(seq_len, bucket, doc_id=str(d), seed=seed,
                                  samples_per_bucket=float(attrs["samples_per_bucket"]), min_per_bucket=0)
        keep |= (doc == d) & np.isin(pos, chosen)
    return keep


#: Version of the reseeded null :func:`reseed_null` keeps (``store``): bump it when its values change.
RESEED_SCHEMA = 1
#: the parts of qkplast the reseeded null is computed by (their code's digest is in the kept product's key)
RESEED_CODE = ("analysis", "stats", "capture/sampling.py", "experiments/condition_captures.py", "tensors.py",
               "options.py")


def reseed_null(all_positions: xr.Dataset, baseline: xr.Dataset, n: int, options: AnalysisOptions | None = None,
                progress: bool = False, *, store=None) -> pd.DataFrame:
    """AP_drop's parts of ``n`` reseeded baselines minus the baseline's: the null of no intervention.

    Seeds ``baseline seed + 1 .. + n`` (:func:`reseeded_captures`); one row per seed, one column per quantity.
    The reseeded baselines are cuts of ``all_positions`` (:func:`seed_keep`), each with its own key pairs drawn as a
    capture of its own would draw them, analysed in one batch
    (:func:`qkplast.analysis.decompose.model_level_terms_of_cuts`): the values of :func:`model_level_terms` on each
    of :func:`reseeded_captures`' captures. ``store`` (``store(stem, key, compute)``,
    :func:`qkplast.rundir.product_store`) keeps them under ``conditions/reseed-null``, keyed by the two captures'
    content, ``n``, the options and the code, and reads them back. ``progress`` is kept for callers; the batch has
    no per-seed steps to show.
    """
    from qkplast.analysis.decompose import ModelLevelTerms, model_level_terms_of_cuts
    from qkplast.provenance import content_digest, product_provenance
    from qkplast.tensors import resolve_device

    opt = options or AnalysisOptions()
    seeds = int(baseline.attrs["seed"]) + 1 + np.arange(n)

    def compute() -> xr.Dataset:
        base = ModelLevelTerms(opt)(baseline)  # [quantity]
        keeps = np.stack([seed_keep(all_positions, int(s), baseline.attrs) for s in seeds])  # [seed, sample]
        source = all_positions.copy()  # the cuts' buckets and window are the baseline's (shallow: no data copied)
        source.attrs = dict(baseline.attrs)
        values = model_level_terms_of_cuts(source, keeps, opt)  # [seed, quantity]
        return xr.Dataset({"difference": (("seed", "quantity"), values - base)},
                          coords={"seed": seeds, "quantity": list(QUANTITIES)})

    if store is None:
        kept = compute()
    else:
        key = {"schema": RESEED_SCHEMA, "product": "reseeded null of the AP_drop parts", "n": int(n),
               "options": opt.result_key(), "all_positions": content_digest(all_positions),
               "baseline": content_digest(baseline),
               "sampling": {a: str(baseline.attrs[a]) for a in ("seq_len", "bucket_size", "samples_per_bucket", "seed")},
               "provenance": product_provenance(*RESEED_CODE, device=str(resolve_device(opt.device)))}
        kept = store("conditions/reseed-null", key, compute)
    return pd.DataFrame(kept["difference"].values, columns=list(QUANTITIES), index=pd.Index(seeds, name="seed"))
