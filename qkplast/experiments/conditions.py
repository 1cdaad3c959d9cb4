"""What drives content decay (thesis 7.6): captures under controlled conditions and a bootstrap table.

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
``baseline_reseeded`` the baseline with other sampled positions: the null (no intervention)

Intervals come from a bootstrap over documents that reuses each condition's
fitted query model and reweights the documents of its key pairs (see
:func:`bootstrap_parts`); conditions share their documents, so differences to
the baseline are paired (the same document weights in both).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr

from qkplast._torch import as_f64, auto_chunk, head_chunks, resolve_device, to_numpy
from qkplast.analysis.decompose import PARTS, VARIANTS, counterfactual_model, drop_of, fitted_layout, rotate_and_fit
from qkplast.analysis.plasticity import edge_masks
from qkplast.capture.hooks import attention_transform
from qkplast.options import AnalysisOptions, CaptureOptions
from qkplast.analysis.views import analysis_vectors
from qkplast.analysis.plasticity import closed_form_kernel

QUANTITIES = ("ap_drop",) + PARTS


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
    """Condition name -> its settings (``seq_len``, ``rope``, ``start``, ``bos``, ``mask_k``, ``seed_shift``).

    ``baseline_reseeded`` repeats the baseline with other sampled positions
    (seed + 1): no intervention, so its difference to the baseline is the null
    against which the interventions' differences are read.
    """
    base = {"seq_len": seq_len, "rope": 1.0, "start": 0, "bos": False, "mask_k": 0, "seed_shift": 0}
    grid = {"baseline": base, "baseline_reseeded": {**base, "seed_shift": 1}}
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
                       reuse: xr.Dataset | None = None) -> tuple[dict[str, xr.Dataset], dict]:
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
    """
    from qkplast.capture.corpus import open_corpus_for
    from qkplast.capture.driver import capture as capture_into
    from qkplast.capture.models import load_for, quiet_transformers
    from qkplast.io import open_capture, save_capture

    run = capture or CaptureOptions()
    offset = seq_len // 2 if offset is None else int(offset)
    grid = condition_grid(seq_len, rope_factors, window_lengths, sinks, mask_k, offset)
    seed = run.seed
    settings = {"model": run.model, "revision": run.revision, "rope_scaling": run.rope_scaling, "corpus": run.corpus,
                "docs": docs, "samples_per_bucket": samples_per_bucket, "heads": heads, "seed": seed, "dtype": run.dtype}
    if run.tokenizer is not None:  # only when set, so the cache keys of runs with the model's own stay as they were
        settings["tokenizer"] = run.tokenizer
    folder = Path(run_dir) / "conditions"
    folder.mkdir(parents=True, exist_ok=True)

    def path_of(name, spec):
        key = json.dumps({**settings, **spec, "max_len": max(c["seq_len"] + c["start"] for c in grid.values())},
                         sort_keys=True)
        return folder / f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:10]}.nc"

    out, seconds, loaded, tokens = {}, {}, None, None
    with quiet_transformers():  # weight-loading bars would make the notebook output machine-dependent
        for name, spec in grid.items():
            path = path_of(name, spec)
            if path.exists():
                out[name], seconds[name] = open_capture(path), 0.0
                continue
            if loaded is None:
                loaded = load_for(run)
                need = max(c["seq_len"] + c["start"] for c in grid.values()) + 16  # margin: decode + re-encode may merge a few tokens
                tokens = select_documents(open_corpus_for(run),
                                          loaded.tokenizer, docs, need)
            t0 = time.perf_counter()
            resolved = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")  # "auto" as loaded
            cut = _cut_from(reuse, spec, {**settings, "dtype": resolved}, tokens)
            if cut is not None:
                cut.attrs["condition"], cut.attrs["condition_settings"] = name, spec
                save_capture(cut, path, overwrite=True)
                out[name], seconds[name] = cut, 0.0
                continue
            prefix = loaded.tokenizer.bos_token if spec["bos"] else ""
            if spec["bos"] and not prefix:
                raise ValueError(f"the tokenizer of {run.model} has no BOS token; drop 'bos' from the sink conditions")
            documents = _documents(tokens, loaded.tokenizer, spec["start"], prefix)
            with contextlib.ExitStack() as stack:
                if spec["rope"] != 1.0:
                    stack.enter_context(rope_base_scaled(loaded.model, spec["rope"]))
                if spec["mask_k"]:
                    stack.enter_context(first_keys_masked(loaded.model, spec["mask_k"]))
                options = replace(run, seq_len=spec["seq_len"], bucket_size=spec["seq_len"] // 16,
                                  samples_per_bucket=samples_per_bucket, heads=heads, seed=seed + spec["seed_shift"],
                                  docs=docs, short_docs="skip", min_per_bucket=0)
                cap = capture_into(loaded.model, loaded.tokenizer, documents, None, options, progress=progress,
                                   model_info=loaded.info)
            if spec["mask_k"]:  # masked keys cannot win: they leave the analysis as keys (and as queries)
                cap = cap.isel(sample=np.flatnonzero(cap.position.values >= spec["mask_k"]))
            cap.attrs["condition"] = name
            cap.attrs["condition_settings"] = spec
            save_capture(cap, path, overwrite=True)
            out[name], seconds[name] = cap, round(time.perf_counter() - t0, 2)
    return out, seconds


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

    if reuse is None or spec["rope"] != 1.0 or spec["start"] or spec["bos"] or spec["mask_k"]:
        return None
    a = reuse.attrs
    same = (a.get("model") == settings["model"] and a.get("corpus") == settings["corpus"]
            and a.get("revision") == settings["revision"] and a.get("rope_scaling") == settings["rope_scaling"]
            and a.get("tokenizer") == settings.get("tokenizer")
            and str(a.get("dtype")) == str(settings["dtype"]) and int(a["seq_len"]) == spec["seq_len"]
            and int(a["bucket_size"]) == spec["seq_len"] // 16
            and float(a["samples_per_bucket"]) == float(settings["samples_per_bucket"])
            and int(a["seed"]) == settings["seed"] + spec["seed_shift"]
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


# --------------------------------------------------------------------------- decomposition by document


def document_sums(capture: xr.Dataset, options: AnalysisOptions | None = None, **overrides):
    """Counterfactual pair sums by document: ``sums`` ``[variant, head, bucket, doc]``, ``counts`` likewise.

    ``sums / counts`` summed over documents gives the profiles of
    :func:`qkplast.analysis.decompose.counterfactual_ap` exactly (the same pairs, the
    same fitted model); keeping documents apart lets a bootstrap reweight them.
    Returns ``(sums, counts, doc_ids, tau)``.
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)
    dev = resolve_device(opt.device)
    fit = fitted_layout(capture, opt, dev)
    doc_ids, code = np.unique(capture["doc"].values, return_inverse=True)
    pair_doc = torch.as_tensor(code[fit.pairs.i], device=dev)  # [bucket, pair]
    onehot = (pair_doc[..., None] == torch.arange(len(doc_ids), device=dev)).to(torch.float64)  # [bucket, pair, doc]
    counts_b = torch.as_tensor(np.where(fit.usable, fit.counts, 0), device=dev, dtype=torch.float64)
    pi, pj = torch.as_tensor(fit.pairs.i, device=dev), torch.as_tensor(fit.pairs.j, device=dev)
    dim = capture.sizes["dim"]
    per_head = 8 * len(fit.buckets) * opt.n_pairs * dim * 3
    sums, counts = [], []
    for sl in head_chunks(capture.sizes["head"], opt.head_chunk or auto_chunk(per_head, dev)):
        q, k = as_f64(capture["q"].values[sl], dev), as_f64(capture["k"].values[sl], dev)  # [head, sample, dim]
        _, kr, model = rotate_and_fit(q, k, fit, opt)
        delta = kr[:, pi] - kr[:, pj]  # [head, bucket, pair, dim]
        s_v, c_v = [], []
        for positional, content in VARIANTS:
            pp = closed_form_kernel(delta, counterfactual_model(model, counts_b, bool(positional), bool(content)))
            ok = (fit.pvalid[None] & ~torch.isnan(pp)).to(torch.float64)  # [head, bucket, pair]
            s_v.append(torch.einsum("hbp,bpd->hbd", torch.nan_to_num(pp) * ok, onehot))
            c_v.append(torch.einsum("hbp,bpd->hbd", ok, onehot))
        sums.append(torch.stack(s_v)), counts.append(torch.stack(c_v))
    return to_numpy(torch.cat(sums, 1)), to_numpy(torch.cat(counts, 1)), doc_ids, fit.tau


def parts_from_weights(sums: np.ndarray, counts: np.ndarray, weights: np.ndarray, first, last) -> np.ndarray:
    """Model-level means over heads of ``ap_drop`` and its parts for document weights ``[rep, doc]``: ``[rep, quantity]``."""
    s = np.einsum("rd,vhbd->rvhb", weights, sums)
    c = np.einsum("rd,vhbd->rvhb", weights, counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        ap = np.where(c > 0, s / np.where(c > 0, c, 1), np.nan)  # [rep, variant, head, bucket]
    d11, d10, d01, d00 = np.moveaxis(drop_of(ap, first, last), 1, 0)  # each [rep, head]
    per_head = np.stack([d11, d10 - d00, d01, d11 - (d10 - d00) - d01, d00], -1)  # [rep, head, quantity]
    with np.errstate(invalid="ignore"):
        return np.nanmean(per_head, 1)


def bootstrap_parts(capture: xr.Dataset, options: AnalysisOptions | None = None, n_boot: int = 2000, seed: int = 0,
                    weights: np.ndarray | None = None, chunk: int = 200) -> dict:
    """Estimate and bootstrap replicates of the model-level ``ap_drop`` and its parts.

    A replicate draws the documents with replacement (multinomial weights,
    shared across conditions when ``weights`` ``[rep, doc]`` is given) and
    recomputes every bucket average over the drawn documents' key pairs, the
    fitted query model held at the full capture's fit. It therefore measures
    the variability that comes from which documents supply the key pairs, not
    the estimation error of the query statistics (smaller when more documents
    are captured). Vectorised: one einsum per chunk of replicates.
    """
    opt = options or AnalysisOptions()
    sums, counts, doc_ids, tau = document_sums(capture, opt)
    first, last = edge_masks(tau, int(capture.attrs["seq_len"]), opt)
    n_doc = len(doc_ids)
    if weights is None:
        rng = np.random.default_rng(seed)
        weights = rng.multinomial(n_doc, np.full(n_doc, 1 / n_doc), size=n_boot).astype(float)
    estimate = parts_from_weights(sums, counts, np.ones((1, n_doc)), first, last)[0]
    reps = np.concatenate([parts_from_weights(sums, counts, weights[s: s + chunk], first, last)
                           for s in range(0, len(weights), chunk)])
    return {"estimate": estimate, "replicates": reps, "doc_ids": doc_ids}


def condition_table(captures: dict[str, xr.Dataset], options: AnalysisOptions | None = None, n_boot: int = 2000,
                    level: float = 0.95, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """AP_drop and its decomposition per condition, and each condition's difference to ``baseline``.

    Returns two long tables (condition, quantity, estimate, lo, hi): the
    percentile bootstrap intervals of the values, and of the paired
    differences to the baseline (the same document weights, documents matched
    by their position in the capture's sorted ids) with ``excludes_zero``.
    """
    if "baseline" not in captures:
        raise ValueError("condition_table needs a 'baseline' condition")
    n_docs = {name: len(np.unique(c.doc.values)) for name, c in captures.items()}
    if len(set(n_docs.values())) != 1:
        raise ValueError(f"conditions have different document counts {n_docs}: a paired bootstrap needs the same documents")
    n = n_docs["baseline"]
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(n, np.full(n, 1 / n), size=n_boot).astype(float)
    res = {name: bootstrap_parts(cap, options, weights=weights) for name, cap in captures.items()}
    a = (1 - level) / 2
    rows, diffs = [], []
    base = res["baseline"]
    for name, r in res.items():
        lo, hi = np.nanquantile(r["replicates"], [a, 1 - a], axis=0)
        for i, qty in enumerate(QUANTITIES):
            rows.append({"condition": name, "quantity": qty, "estimate": r["estimate"][i], "lo": lo[i], "hi": hi[i]})
        if name == "baseline":
            continue
        d = r["replicates"] - base["replicates"]
        dlo, dhi = np.nanquantile(d, [a, 1 - a], axis=0)
        for i, qty in enumerate(QUANTITIES):
            diffs.append({"condition": name, "quantity": qty, "estimate": r["estimate"][i] - base["estimate"][i],
                          "lo": dlo[i], "hi": dhi[i], "excludes_zero": bool(dlo[i] > 0 or dhi[i] < 0)})
    return pd.DataFrame(rows), pd.DataFrame(diffs)


def read_conditions(diffs: pd.DataFrame, quantity: str = "ap_drop_content", null: str = "baseline_reseeded") -> pd.DataFrame:
    """Which interventions move ``quantity`` beyond the null.

    A condition counts as moving it when its paired bootstrap interval of the
    difference to the baseline excludes 0 *and* the difference is larger in
    size than anything the reseeded baseline's interval allows (the same model
    and documents with other sampled positions, i.e. no intervention: the
    larger end of its interval in absolute value). Returns one row per
    condition, with the null size in ``null_size``.
    """
    sub = diffs[diffs.quantity == quantity].set_index("condition")
    # the null's size: the largest difference its paired interval allows (resampled positions, no intervention)
    null_size = float(max(abs(sub.loc[null, "lo"]), abs(sub.loc[null, "hi"]))) if null in sub.index else 0.0
    out = sub[["estimate", "lo", "hi", "excludes_zero"]].copy()
    out["null_size"] = null_size
    out["beyond_null"] = out.excludes_zero & (out.estimate.abs() > null_size)
    if null in out.index:
        out.loc[null, "beyond_null"] = False
    return out
