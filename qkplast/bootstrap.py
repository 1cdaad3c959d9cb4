"""Bootstrap confidence intervals over documents (the thesis reports none; section 7.5 names its limits).

The thesis reports point estimates. The unit of independent sampling in a
capture is the document: positions within one document share its content. A
replicate draws as many documents as the capture has, with replacement; each
drawn copy keeps its own id (``doc#copy``) so key pairs never straddle two
copies, and the statistics, the Householder basis, the positional fit, the
per-bucket query model and the key pairs are all recomputed on the replicate.
Intervals are for the model-level means over heads (see :func:`bootstrap`).
"""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr
from tqdm.auto import tqdm

from ._torch import as_f64, resolve_device
from .options import AnalysisOptions
from .plasticity import closed_form_ap, summarize_profile
from .rotation import rotation_kernel

METRICS = ("ap_overall", "ap_first20", "ap_last20", "ap_drop", "bias_strength")


def resample_documents(capture: xr.Dataset, rng: np.random.Generator) -> xr.Dataset:
    """One bootstrap replicate: documents drawn with replacement, each copy a distinct document."""
    docs, code = np.unique(capture.doc.values, return_inverse=True)
    members = [np.flatnonzero(code == d) for d in range(len(docs))]
    pick = rng.integers(0, len(docs), len(docs))
    idx = np.concatenate([members[d] for d in pick])
    new_doc = np.concatenate([np.full(len(members[d]), f"{docs[d]}#{c}") for c, d in enumerate(pick)])
    return capture.isel(sample=idx).assign_coords(doc=("sample", new_doc))


def model_level(capture: xr.Dataset, options: AnalysisOptions) -> dict[str, float]:
    """Means over heads of the closed-form plasticity aggregates and of bias_strength."""
    ap, lay = closed_form_ap(capture, options)
    agg = summarize_profile(ap, lay.pairs.tau, lay.width, lay.counts, int(capture.attrs["seq_len"]), options)
    dev = resolve_device(options.device)
    t = as_f64(capture["position"], dev)
    bias = torch.cat([
        rotation_kernel(as_f64(capture["q"][s: s + 64], dev), as_f64(capture["k"][s: s + 64], dev), t)["bias_strength"]
        for s in range(0, capture.sizes["head"], 64)
    ])
    out = {name: float(np.nanmean(agg[name][1])) for name in METRICS[:4]}
    out["bias_strength"] = float(bias.mean())
    return out


def bootstrap(capture: xr.Dataset, n_boot: int = 50, level: float = 0.95, seed: int = 0,
              options: AnalysisOptions | None = None, progress: bool = False, **overrides) -> xr.Dataset:
    """Bootstrap over documents of the model-level AP aggregates and mean bias_strength.

    Returns a Dataset with dim ``metric``: ``estimate`` (full capture), ``lo``,
    ``hi`` (the basic bootstrap interval at ``level``), ``lo_percentile``,
    ``hi_percentile`` (the percentile interval), ``bias`` (mean of the
    replicates minus the estimate), ``se`` (bootstrap standard error), and
    ``replicates`` (dims ``metric, replicate``).

    Notes
    -----
    The basic interval ``[2 est - q_hi, 2 est - q_lo]`` is the default because
    the replicates are biased for plasticity: a replicate repeats documents,
    which shrinks the per-bucket query variances, makes score differences look
    more decisive and lowers plasticity. The percentile interval inherits that
    shift; the basic interval uses only the replicates' spread around their
    own centre. Both are returned, with the bias, so the reader can judge.
    """
    if n_boot < 2:
        raise ValueError(f"n_boot must be at least 2, got {n_boot}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    n_docs = len(np.unique(capture.doc.values))
    if n_docs < 2:
        raise ValueError(f"a bootstrap over documents needs at least two documents, the capture has {n_docs}")
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    rng = np.random.default_rng(seed)
    estimate = model_level(capture, opt)
    reps = np.array([list(model_level(resample_documents(capture, rng), opt).values())
                     for _ in tqdm(range(n_boot), desc="bootstrap", disable=not progress)])  # [replicate, metric]
    alpha = (1 - level) / 2
    est = np.array([estimate[m] for m in METRICS])
    q_lo, q_hi = np.nanquantile(reps, alpha, axis=0), np.nanquantile(reps, 1 - alpha, axis=0)
    ds = xr.Dataset(
        {
            "estimate": ("metric", est),
            "lo": ("metric", 2 * est - q_hi),
            "hi": ("metric", 2 * est - q_lo),
            "lo_percentile": ("metric", q_lo),
            "hi_percentile": ("metric", q_hi),
            "bias": ("metric", np.nanmean(reps, axis=0) - est),
            "se": ("metric", np.nanstd(reps, axis=0, ddof=1)),
            "replicates": (("metric", "replicate"), reps.T),
        },
        coords={"metric": list(METRICS)},
        attrs={"n_boot": n_boot, "level": level, "seed": seed, "n_docs": n_docs,
               "method": "bootstrap over documents, every statistic recomputed per replicate; lo/hi: basic interval"},
    )
    return ds
