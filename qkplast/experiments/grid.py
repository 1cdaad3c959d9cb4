"""The intervention grid of the chapter "Beyond the thesis: interventions", its statistics and figures.

One grid run scores copying by distance (:func:`qkplast.experiments.behavior.copy_by_distance`)
under: no intervention; zero-ablation of the ``k`` heads with the lowest
``ap_last20``, of ``k`` uniformly random heads (``n_random`` draws), of the ``k``
highest; and the bias clamp (:func:`qkplast.experiments.intervene.clamp_bias`, both modes)
of the ``k`` heads with the largest ``|bias_strength|``. Every condition sees
the same windows with the same planted segments, so effects are paired by
window, and the bootstrap resamples windows (the independent unit).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
import xarray as xr

from qkplast.experiments.behavior import copy_by_distance
from qkplast.experiments.calibrate import calibrate_and_capture, calibrate_clamp, capture_windows
from qkplast.experiments.intervene import InterventionError, ablate_heads, clamp_bias, select_heads
from qkplast.options import CaptureOptions
from qkplast.analysis.plasticity import PlasticityWarning

__all__ = ["Condition", "conditions", "run_grid", "paired_bootstrap", "effect_table", "random_null",
           "readings", "clamp_geometry", "plot_copy_by_distance", "plot_effects", "plot_clamp_geometry", "contrast",
           "baseline_table", "load", "load_or_run_grid", "load_or_clamp_geometry", "calibrate_clamps",
           "load_or_calibrate"]

CLAMP_BY = "bias_strength"
ABLATE_BY = "ap_last20"


class Condition:
    """One intervention of the grid: ``kind`` in {"none", "lowest", "random", "highest", "clamp query", "clamp key"}."""

    def __init__(self, kind: str, k: int = 0, draw: int = -1, heads: Sequence[tuple[int, int]] = ()):
        self.kind, self.k, self.draw, self.heads = kind, k, draw, list(heads)

    @property
    def mode(self) -> str | None:
        """The clamp mode ("query" or "key") of a clamp condition, else None."""
        return self.kind.split()[1] if self.kind.startswith("clamp") else None

    def context(self, model, metrics, calibrated: dict | None = None):
        """The intervention as a context manager; a clamp uses ``calibrated[(mode, k)]`` when given."""
        if self.mode:
            return clamp_bias(model, (calibrated or {}).get((self.mode, self.k), metrics), self.heads, mode=self.mode)
        return ablate_heads(model, self.heads if self.kind != "none" else [])


def conditions(metrics: xr.Dataset, ks: Sequence[int], n_random: int, seed: int = 0) -> list[Condition]:
    """The grid's conditions; random draw ``r`` for ``k`` uses ``default_rng([seed, k, r])``."""
    out = [Condition("none")]
    finite_bias = metrics.isel(head=np.isfinite(metrics["axis_a"].values).all(-1))
    # a k beyond the heads a (small) model has is capped there, so one grid serves every model
    for k in sorted({min(int(k), metrics.sizes["head"]) for k in ks}):
        out.append(Condition("lowest", k, heads=select_heads(metrics, k, ABLATE_BY)))
        out += [Condition("random", k, r, select_heads(metrics, k, "random", seed=[seed, k, r])) for r in range(n_random)]
        out.append(Condition("highest", k, heads=select_heads(metrics, k, ABLATE_BY, largest=True)))
        top = select_heads(finite_bias, min(k, finite_bias.sizes["head"]), CLAMP_BY, largest=True, absolute=True)
        out += [Condition("clamp query", k, heads=top), Condition("clamp key", k, heads=top)]
    return out


def run_grid(model, tokenizer, corpus, metrics: xr.Dataset, *, ks: Sequence[int], n_random: int,
             distances: Sequence[int], windows: int, seq_len: int, seg_len: int = 24, seed: int = 0,
             progress: bool = False, calibrated: dict | None = None) -> xr.Dataset:
    """Copy ``acc``/``nll`` for every condition: dims ``condition, window, distance``.

    Coords on ``condition``: ``kind``, ``k``, ``draw`` (-1 unless random) and
    ``heads`` (the heads, as text). ``calibrated`` (from :func:`calibrate_clamps`)
    maps ``(mode, k)`` to the calibrated clamp of that condition; without it the
    clamps use ``metrics`` as they are.
    """
    from tqdm.auto import tqdm

    from qkplast.experiments.behavior import token_windows

    conds = conditions(metrics, ks, n_random, seed)
    corpus_windows = token_windows(corpus, tokenizer, seq_len, windows)  # tokenised once for every condition
    parts = []
    for cond in tqdm(conds, desc="conditions", disable=not progress):
        with cond.context(model, metrics, calibrated):
            ds = copy_by_distance(model, tokenizer, corpus_windows, distances,
                                  windows=windows, seq_len=seq_len, seg_len=seg_len, seed=seed)
        parts.append(ds[["acc", "nll"]])
    grid = xr.concat(parts, dim="condition")
    return grid.assign_coords(
        kind=("condition", [c.kind for c in conds]), k=("condition", [c.k for c in conds]),
        draw=("condition", [c.draw for c in conds]),
        heads=("condition", [" ".join(f"{la}.{h}" for la, h in c.heads) for c in conds]),
    ).assign_attrs(**parts[0].attrs, model=str(getattr(model.config, "_name_or_path", "")),
                   ablate_by=ABLATE_BY, clamp_by=f"|{CLAMP_BY}|", clamp_calibrated=calibrated is not None)


def _capture_settings(capture: xr.Dataset, docs: int) -> CaptureOptions:
    """The settings ``capture`` recorded (first ``docs`` windows), so a re-capture differs only by the intervention."""
    attrs = capture.attrs
    return CaptureOptions(seq_len=int(attrs["seq_len"]), bucket_size=int(attrs["bucket_size"]),
                          samples_per_bucket=float(attrs["samples_per_bucket"]),
                          min_per_bucket=int(attrs["min_per_bucket"]), heads=attrs.get("heads"),
                          seed=int(attrs["seed"]), docs=docs, short_docs=attrs["short_docs"])


CALIBRATED = ("axis_a", "alpha_k", "mu_q_a", "bias_strength", "key_drift")


def calibrate_clamps(model, tokenizer, corpus, capture: xr.Dataset, metrics: xr.Dataset, *, ks: Sequence[int],
                     docs: int = 1, seed: int = 0, recapture: bool = False) -> tuple[dict, dict]:
    """Every clamp condition of the grid calibrated (:func:`qkplast.experiments.calibrate.calibrate_clamp`).

    Each clamp (mode, k) is calibrated on the first ``docs`` windows of the
    capture, at the capture's own sampled positions: one forward pass of
    those windows per condition, in which every clamped layer is measured with
    the clamped layers below it already clamped. With ``recapture`` and one
    window, the pass of each clamp at the largest ``k`` goes on through every
    layer and records the capture's settings under the clamp it calibrates
    (:func:`qkplast.experiments.calibrate.calibrate_and_capture`): the re-captured geometry
    of :func:`clamp_geometry` without a second forward pass.

    Returns
    -------
    calibrated : dict
        ``{(mode, k): calibrated metrics}``.
    recaptured : dict
        ``{mode: capture}`` under the clamps of the largest ``k`` (empty unless ``recapture``).
    """
    options = _capture_settings(capture, docs)
    conds = [c for c in conditions(metrics, ks, 0, seed) if c.mode]
    k_geometry = max((c.k for c in conds), default=None)
    in_pass = recapture and docs == 1
    calibrated, recaptured = {}, {}
    if not all(in_pass and c.k == k_geometry for c in conds):  # some clamp is calibrated on its own
        ids, mask = capture_windows(tokenizer, corpus, options)
    for cond in conds:
        if in_pass and cond.k == k_geometry:
            calibrated[(cond.mode, cond.k)], recaptured[cond.mode] = calibrate_and_capture(
                model, tokenizer, corpus, metrics, cond.heads, options, mode=cond.mode)
        else:
            calibrated[(cond.mode, cond.k)] = calibrate_clamp(model, metrics, cond.heads, ids, mode=cond.mode,
                                                              positions=mask)
    return calibrated, recaptured


def load_or_calibrate(run_dir, model, tokenizer, corpus, capture: xr.Dataset, metrics: xr.Dataset, *,
                      ks: Sequence[int], docs: int = 1, seed: int = 0, recapture: bool = False) -> dict:
    """:func:`calibrate_clamps`, cached in ``run_dir``: the calibrated variables of every (mode, k) in one file.

    With ``recapture``, the captures taken in the calibrating passes are kept
    beside it (``clamp-recapture-<hash>-<mode>.nc``) and each such clamp's
    ``attrs["clamp_calibration"]["recaptured"]`` names its file, where
    :func:`load_or_clamp_geometry` finds it.
    """
    from pathlib import Path

    from qkplast.io import save_capture

    key = {"metrics": _metrics_key(metrics), "calibration": {"ks": list(ks), "docs": docs, "seed": seed},
           **({"recapture": True} if recapture else {})}
    digest = _digest(key)

    def compute():
        cal, again = calibrate_clamps(model, tokenizer, corpus, capture, metrics, ks=ks, docs=docs, seed=seed,
                                      recapture=recapture)
        files = {}
        for mode, ds in again.items():
            files[mode] = f"clamp-recapture-{digest}-{mode}.nc"
            save_capture(ds, Path(run_dir) / files[mode], overwrite=True)
        labels = list(cal)
        k_geometry = max(k for _, k in labels)
        notes = [dict(cal[(mode, k)].attrs["clamp_calibration"],
                      **({"recaptured": files[mode]} if mode in files and k == k_geometry else {}))
                 for mode, k in labels]
        return xr.Dataset(
            {name: (("clamp", *metrics[name].dims) if name in metrics else ("clamp", "head", "dim"),
                    np.stack([cal[c][name].values for c in labels])) for name in CALIBRATED},
            coords={"clamp_mode": ("clamp", [m for m, _ in labels]), "clamp_k": ("clamp", [k for _, k in labels])},
            attrs={"calibration": notes})

    ds = _cached(run_dir, "clamp-calibration", key, compute)
    out = {}
    for i, (mode, k) in enumerate(zip(ds.clamp_mode.values, ds.clamp_k.values)):
        one = metrics.copy()
        for name in CALIBRATED:
            one[name] = (ds[name].dims[1:], ds[name].values[i])
        one.attrs = dict(metrics.attrs, clamp_calibration=ds.attrs["calibration"][i])
        out[(str(mode), int(k))] = one
    return out


def paired_bootstrap(values: np.ndarray, n_boot: int = 2000, seed: int = 0, *, draws: bool = False) -> np.ndarray:
    """Bootstrap means over the last axis (windows) of ``values`` ``[..., window]``: ``[n_boot, ...]``.

    One index matrix ``[n_boot, window]`` is drawn first from a generator
    seeded with ``seed`` and applied to every row, so two calls with the same
    seed and window count resample the same windows: differences stay paired
    by window. With ``draws=True`` the axis before the windows holds random
    draws (``[..., draw, window]``), resampled too (two-level bootstrap), so an
    interval for a random-head condition includes the spread between draws.
    The resampling is one gather and one mean in float64 (torch, so it runs on
    a GPU unchanged).
    """
    v = torch.as_tensor(np.array(values, dtype=np.float64))  # [..., (draw,) window]
    n = v.shape[-1]
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (n_boot, n), generator=g)  # [boot, window]
    if not draws:
        return v[..., idx].mean(-1).movedim(-1, 0).numpy()  # [boot, ...]
    n_draw = v.shape[-2]
    didx = torch.randint(0, n_draw, (n_boot, n_draw), generator=g)  # [boot, draw]
    per_draw = v[..., idx].mean(-1)  # [..., draw, boot]
    picked = per_draw.gather(-2, didx.T.expand(*per_draw.shape[:-2], n_draw, n_boot))  # [..., draw, boot]
    return picked.mean(-2).movedim(-1, 0).numpy()  # [boot, ...]


def _interval(est, reps, level):
    a = (1 - level) / 2
    return est, np.quantile(reps, a, axis=0), np.quantile(reps, 1 - a, axis=0)


def effect_table(grid: xr.Dataset, var: str = "acc", n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> pd.DataFrame:
    """Effect of each (kind, k) on ``var``, minus no intervention, with percentile bootstrap intervals over windows.

    Columns per row (kind, k): the effect averaged over distances (``mean``),
    at the nearest and farthest distance (``near``, ``far``) and
    ``far - near`` (does the effect grow with distance?). Random draws are
    averaged over draws, and their intervals resample draws as well as
    windows (see :func:`paired_bootstrap`).
    """
    base = grid[var].sel(condition=grid.kind == "none").isel(condition=0)  # [window, distance]
    rows = []
    keys = sorted({(str(kd), int(k)) for kd, k in zip(grid.kind.values, grid.k.values) if kd != "none"},
                  key=lambda x: (x[1], x[0]))
    for kind, k in keys:
        sel = (grid.kind == kind) & (grid.k == k)
        eff = grid[var].sel(condition=sel) - base  # [draw, window, distance]
        stats = np.stack([eff.mean("distance"), eff.isel(distance=0), eff.isel(distance=-1),
                          eff.isel(distance=-1) - eff.isel(distance=0)])  # [stat, draw, window]
        reps = paired_bootstrap(stats, n_boot, seed, draws=True)  # [boot, stat]
        est, lo, hi = _interval(stats.mean((-2, -1)), reps, level)
        for name, e, l_, h_ in zip(("mean", "near", "far", "far - near"), est, lo, hi):
            rows.append({"kind": kind, "k": k, "effect": name, "estimate": e, "lo": l_, "hi": h_})
    out = pd.DataFrame(rows)
    out.attrs.update(var=var, n_boot=n_boot, level=level,
                     method="percentile bootstrap over windows, paired (same windows for every condition)")
    return out


def random_null(grid: xr.Dataset, var: str = "acc") -> pd.DataFrame:
    """Where targeted ablations fall in the distribution of random-head draws (mean over windows and distances).

    ``share_random_below``: the fraction of random draws with a lower mean
    ``var`` than the targeted condition (0 or 1 at the edges of the null).
    """
    mean = grid[var].mean(("window", "distance"))
    rows = []
    for k in sorted(set(int(x) for x in grid.k.values if x > 0)):
        rnd = mean.sel(condition=(grid.kind == "random") & (grid.k == k)).values
        for kind in ("lowest", "highest", "clamp query", "clamp key"):
            sel = (grid.kind == kind) & (grid.k == k)
            if not bool(sel.any()):
                continue
            v = float(mean.sel(condition=sel).values[0])
            rows.append({"k": k, "condition": kind, var: v, "random min": rnd.min(), "random median": np.median(rnd),
                         "random max": rnd.max(), "share_random_below": float((rnd < v).mean()),
                         "draws": len(rnd)})
    return pd.DataFrame(rows)


def contrast(grid: xr.Dataset, a: str, b: str, k: int, var: str = "acc", n_boot: int = 2000, level: float = 0.95,
             seed: int = 0) -> tuple[float, float, float]:
    """Mean ``var`` under kind ``a`` minus under kind ``b`` (random: mean over draws), two-level bootstrap interval."""
    def cond(kind):
        return grid[var].sel(condition=(grid.kind == kind) & (grid.k == k)).mean("distance").values  # [draw, window]

    va, vb = cond(a), cond(b)
    # Same seed and window count: both replicates resample the same windows (paired); draws are resampled within
    # the random condition, so the interval carries the spread between random head sets.
    reps = paired_bootstrap(va, n_boot, seed, draws=True) - paired_bootstrap(vb, n_boot, seed, draws=True)
    return _interval(float(va.mean() - vb.mean()), reps, level)


def _verdict(lo: float, hi: float, sign: int) -> str:
    if sign * lo > 0 and sign * hi > 0:
        return "supported"
    if sign * lo < 0 and sign * hi < 0:
        return "contradicted"
    return "left open"


def readings(grid: xr.Dataset, geometry: pd.DataFrame | None = None, n_boot: int = 2000, level: float = 0.95,
             seed: int = 0) -> pd.DataFrame:
    """The thesis's causal readings, each with the measured contrast, its interval and a verdict.

    A reading is ``supported`` when the whole interval lies on the predicted
    side of zero, ``contradicted`` when it lies on the other side, and
    ``left open`` otherwise (an interval across zero is not evidence of no effect).
    """
    rows = []
    eff = effect_table(grid, "acc", n_boot, level, seed)
    for k in sorted(set(int(x) for x in grid.k.values if x > 0)):
        est, lo, hi = contrast(grid, "lowest", "random", k, n_boot=n_boot, level=level, seed=seed)
        rows.append({"reading": "ablating low-plasticity heads (lowest AP_last20) hurts copying more than random "
                                "heads (7.5)", "k": k, "measure": "acc(lowest) - acc(random)",
                     "estimate": est, "lo": lo, "hi": hi, "verdict": _verdict(lo, hi, -1)})
        est, lo, hi = contrast(grid, "highest", "random", k, n_boot=n_boot, level=level, seed=seed)
        rows.append({"reading": "high-plasticity heads (highest AP_last20) are necessary: ablating them hurts "
                                "more than random heads (7.6)", "k": k, "measure": "acc(highest) - acc(random)",
                     "estimate": est, "lo": lo, "hi": hi, "verdict": _verdict(lo, hi, -1)})
        r = eff[(eff.kind == "highest") & (eff.k == k) & (eff.effect == "far - near")].iloc[0]
        rows.append({"reading": "... and selectively at distance (7.6)", "k": k,
                     "measure": "effect(far) - effect(near), highest", "estimate": r.estimate, "lo": r.lo, "hi": r.hi,
                     "verdict": _verdict(r.lo, r.hi, -1)})
        for mode in ("query", "key"):
            r = eff[(eff.kind == f"clamp {mode}") & (eff.k == k) & (eff.effect == "far")].iloc[0]
            rows.append({"reading": f"clamping the bias ({mode} mode) of the most biased heads helps distant copying "
                                    "(7.6, behaviour)", "k": k, "measure": "acc effect at the farthest distance",
                         "estimate": r.estimate, "lo": r.lo, "hi": r.hi, "verdict": _verdict(r.lo, r.hi, +1)})
    if geometry is not None:
        for mode, g in geometry.groupby("mode"):
            d = (g["ap_last20 clamped"] - g["ap_last20 plain"]).to_numpy()
            reps = paired_bootstrap(d[None], n_boot, seed)[:, 0]
            est, lo, hi = _interval(float(d.mean()), reps, level)
            rows.append({"reading": f"clamping the bias ({mode} mode) raises distant-position plasticity (7.6, "
                                    "geometry; interval over the clamped heads)", "k": len(g),
                         "measure": "AP_last20 clamped - plain", "estimate": est, "lo": lo, "hi": hi,
                         "verdict": _verdict(lo, hi, +1)})
    out = pd.DataFrame(rows)
    out.attrs.update(n_boot=n_boot, level=level)
    return out


def clamp_geometry(model, tokenizer, corpus, capture: xr.Dataset, metrics: xr.Dataset, heads, *,
                   modes=("query", "key"), docs: int = 2, analysis: dict | None = None,
                   calibrated: dict | None = None, recaptured: dict | None = None) -> tuple[pd.DataFrame, xr.Dataset]:
    """Re-capture the clamped heads inside each clamp and compare their geometry with the plain capture.

    The first ``docs`` windows of the capture's corpus are captured again with
    the capture's own settings inside :func:`clamp_bias`; positions and heads
    are seeded by document id and seed, so the plain baseline is the original
    capture restricted to the same documents (no second plain forward), and
    both are analysed the same way. ``calibrated`` maps a mode to its
    calibrated clamp (:func:`calibrate_clamps`); without it the clamp is built
    from ``metrics``. ``recaptured`` maps a mode to a capture already taken
    under its clamp with these settings (the calibrating pass's, see
    :func:`calibrate_clamps`), used instead of capturing again.

    Returns
    -------
    table : pandas.DataFrame
        One row per (mode, head): bias_strength in the full run, on the
        re-captured windows without clamp (plain), under the clamps of the
        layers below (what the calibration measured; the plain value when
        not calibrated) and clamped; ap_last20 and ap_drop plain and clamped;
        the ratio ``|bias clamped| / |bias full run|`` and the cosine between
        the calibrated and the full run's axis ``a``.
    profiles : xarray.Dataset
        ``ap`` (dims ``condition, head, query_bucket``) for "plain" and each mode.
    """
    from qkplast.analysis.metrics import analyze
    from qkplast.capture.driver import capture as run_capture

    options = _capture_settings(capture, docs)
    rows_of = lambda ds: [int(np.flatnonzero((ds.layer.values == la) & (ds.q_head.values == h))[0])  # noqa: E731
                          for la, h in heads]
    analysis = analysis or {}
    clamps = {mode: (calibrated or {}).get(mode, metrics) for mode in modes}
    results = {}
    for mode in modes:
        if mode in (recaptured or {}):
            results[mode] = _check_recaptured(recaptured[mode], options, mode)
            continue
        with clamp_bias(model, clamps[mode], heads, mode=mode):
            results[mode] = run_capture(model, tokenizer, corpus, options=options, progress=False)
    doc_ids = np.unique(next(iter(results.values())).doc.values)
    plain = capture.isel(sample=np.isin(capture.doc.values, doc_ids))
    plain.attrs = dict(capture.attrs, n_docs=len(doc_ids))
    with warnings.catch_warnings():
        # The first bucket has no earlier keys: the run's own analysis already reports that once.
        warnings.simplefilter("ignore", PlasticityWarning)
        analysed = {"plain": analyze(plain.isel(head=rows_of(plain)), **analysis)}
        for mode, again in results.items():
            analysed[mode] = analyze(again.isel(head=rows_of(again)), **analysis)
    full = metrics.isel(head=rows_of(metrics))
    rows = []
    p = analysed["plain"]
    for mode in modes:
        m = analysed[mode]
        upstream = clamps[mode].isel(head=rows_of(clamps[mode]))
        cosine = np.abs((upstream.axis_a.values * full.axis_a.values).sum(-1))
        for i, (la, h) in enumerate(heads):
            rows.append({"mode": mode, "layer": la, "q_head": h,
                         "bias_strength full run": float(full.bias_strength[i]),
                         "bias_strength plain": float(p.bias_strength[i]),
                         "bias_strength under the clamps below": float(upstream.bias_strength[i]),
                         "axis cosine to full run": float(cosine[i]),
                         "bias_strength clamped": float(m.bias_strength[i]),
                         "residual |bias| ratio": abs(float(m.bias_strength[i])) / abs(float(full.bias_strength[i])),
                         "ratio to plain, same docs": abs(float(m.bias_strength[i])) / abs(float(p.bias_strength[i])),
                         "ap_last20 plain": float(p.ap_last20[i]), "ap_last20 clamped": float(m.ap_last20[i]),
                         "ap_drop plain": float(p.ap_drop[i]), "ap_drop clamped": float(m.ap_drop[i])})
    profiles = xr.concat([analysed[c]["ap"] for c in ("plain", *modes)], dim="condition").assign_coords(
        condition=["plain", *modes])
    return pd.DataFrame(rows), profiles.to_dataset(name="ap")


def _check_recaptured(again: xr.Dataset, options: CaptureOptions, mode: str) -> xr.Dataset:
    """A capture handed to :func:`clamp_geometry` must have been taken with the settings it stands for."""
    attrs = again.attrs
    want = {"seq_len": options.seq_len, "bucket_size": options.bucket_size, "seed": options.seed, "n_docs": options.docs}
    got = {name: attrs.get(name) for name in want}
    if got != want:
        raise InterventionError(f"the re-capture for the {mode} clamp was taken with {got}, not {want}; "
                                "delete its clamp-recapture-*.nc file in the run directory to capture again")
    return again


# --------------------------------------------------------------------------- figures


def _fig(ncols=1, width=6.4, height=4.0):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False, layout="constrained")
    return fig, axes[0]


STYLE = {"none": ("k", "-o"), "lowest": ("tab:blue", "-s"), "highest": ("tab:red", "-^"),
         "clamp query": ("tab:green", "--D"), "clamp key": ("tab:purple", "--v"), "random": ("0.6", "-")}


def plot_copy_by_distance(grid: xr.Dataset, k: int, var: str = "acc"):
    """Mean ``var`` by distance under each condition at ``k`` (random draws as thin grey lines).

    A ``k`` beyond the model's heads is capped as :func:`conditions` caps it.
    """
    k = min(int(k), int(grid.k.max()))
    fig, (ax,) = _fig()
    d = grid.distance.values
    mean = grid[var].mean("window")
    for i in np.flatnonzero(((grid.kind == "random") & (grid.k == k)).values):
        ax.plot(d, mean.isel(condition=i), color=STYLE["random"][0], lw=0.8,
                label="random heads (each draw)" if i == np.flatnonzero(((grid.kind == "random") & (grid.k == k)).values)[0]
                else None)
    for kind in ("none", "lowest", "highest", "clamp query", "clamp key"):
        sel = (grid.kind == kind) & ((grid.k == k) | (grid.kind == "none"))
        color, style = STYLE[kind]
        label = {"none": "no intervention", "lowest": f"ablate {k} lowest AP_last20",
                 "highest": f"ablate {k} highest AP_last20"}.get(kind, f"{kind} ({k} most biased)")
        ax.plot(d, mean.sel(condition=sel).isel(condition=0), style, color=color, ms=4, label=label)
    ax.set(xlabel="distance between the two copies (tokens)",
           ylabel="top-1 copy accuracy" if var == "acc" else "NLL of the repeat (nats/token)",
           title=f"copying a random {grid.attrs.get('seg_len', 24)}-token segment, k = {k}")
    if var == "acc":
        ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    return fig


def plot_effects(effects: pd.DataFrame, stat: str = "mean"):
    """Effect on copy accuracy with its bootstrap interval, per condition and k."""
    fig, (ax,) = _fig(height=3.6)
    e = effects[effects.effect == stat].reset_index(drop=True)
    y = np.arange(len(e))
    for yi, row in zip(y, e.itertuples()):
        color = STYLE[row.kind][0] if row.kind != "random" else "0.4"
        ax.errorbar(row.estimate, yi, xerr=[[row.estimate - row.lo], [row.hi - row.estimate]], fmt="o", color=color,
                    capsize=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(y, [f"{kd}, k={k}" for kd, k in zip(e.kind, e.k)])
    ax.invert_yaxis()
    ax.set(xlabel=f"change in copy accuracy vs no intervention ({stat} over distances)",
           title=f"effects with {int(100 * effects.attrs.get('level', 0.95))}% bootstrap intervals over windows")
    return fig


def plot_clamp_geometry(table: pd.DataFrame, profiles: xr.Dataset):
    """Left: |bias_strength| of the clamped heads, plain vs clamped; right: their mean plasticity profile."""
    fig, (a1, a2) = _fig(2, width=5.0)
    modes = list(dict.fromkeys(table["mode"]))
    for j, mode in enumerate(modes):
        t = table[table["mode"] == mode]
        x = np.arange(len(t))
        if j == 0:
            a1.scatter(x, abs(t["bias_strength plain"]), color="k", label="plain", zorder=3)
        a1.scatter(x, abs(t["bias_strength clamped"]), color=STYLE[f"clamp {mode}"][0], marker="x",
                   label=f"clamp {mode}")
    t0 = table[table["mode"] == modes[0]]
    a1.set_xticks(np.arange(len(t0)), [f"{la}.{h}" for la, h in zip(t0.layer, t0.q_head)], rotation=90, fontsize=7)
    a1.set(yscale="symlog", ylabel="|bias_strength| (re-captured)", xlabel="clamped head (layer.q_head)",
           title="bias after re-capture")
    a1.legend(fontsize=8)
    tau = profiles.tau.values if "tau" in profiles.coords else np.arange(profiles.sizes["query_bucket"])
    for cond in profiles.condition.values:
        color = "k" if cond == "plain" else STYLE[f"clamp {cond}"][0]
        a2.plot(tau, profiles.ap.sel(condition=cond).mean("head"), "-o", ms=3, color=color,
                label=str(cond) if cond == "plain" else f"clamp {cond}")
    a2.set(xlabel="query position tau (tokens)", ylabel="mean AP of the clamped heads", ylim=(0, 1),
           title="plasticity profile, re-captured")
    a2.legend(fontsize=8)
    return fig


def baseline_table(grid: xr.Dataset, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Copy accuracy and NLL by distance without intervention, with percentile bootstrap intervals over windows."""
    base = grid.sel(condition=grid.kind == "none").isel(condition=0)
    out = {}
    for var in ("acc", "nll"):
        v = base[var].transpose("distance", "window").values  # [distance, window]
        est, lo, hi = _interval(v.mean(-1), paired_bootstrap(v, n_boot, seed), level)
        out[var], out[f"{var} lo"], out[f"{var} hi"] = est, lo, hi
    return pd.DataFrame(out, index=pd.Index(grid.distance.values, name="distance"))


def load(model: str, *, device: str = "cpu", dtype: str = "auto", rope_scaling=None, revision: str | None = None,
         tokenizer: str | None = None):
    """Load a model for the interventions with transformers' progress bars silenced (deterministic notebook output).

    ``tokenizer`` is the run's :attr:`qkplast.options.CaptureOptions.tokenizer` (None: the model's own).
    """
    from qkplast.pipeline.batch import quiet_transformers
    from qkplast.capture.models import load_model

    with quiet_transformers():
        return load_model(model, device=device, dtype=dtype, rope_scaling=rope_scaling, revision=revision,
                          tokenizer=tokenizer)


# --------------------------------------------------------------------------- caching in the run directory


def _digest(key: dict) -> str:
    import hashlib
    import json

    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _cached(run_dir, stem: str, key: dict, compute) -> xr.Dataset:
    """``RUN/STEM-<hash of key>.nc`` if it exists, else ``compute()`` saved there (so a re-execution is cheap)."""
    import json
    from pathlib import Path

    from qkplast.io import open_dataset, save_dataset

    path = Path(run_dir) / f"{stem}-{_digest(key)}.nc"
    if path.exists():
        return open_dataset(path)
    ds = compute()
    ds.attrs["key"] = json.dumps(key, sort_keys=True, default=str)
    save_dataset(ds, path, overwrite=True)
    return ds


def _metrics_key(metrics: xr.Dataset) -> dict:
    cap = metrics.attrs.get("capture", {})
    return {"model": cap.get("model"), "model_info": cap.get("model_info"), "seq_len": cap.get("seq_len"),
            "n_docs": cap.get("n_docs"), "seed": cap.get("seed"), "options": metrics.attrs.get("options")}


def _calibration_key(calibrated: dict | None):
    return None if calibrated is None else {f"{mode} {k}": c.attrs.get("clamp_calibration")
                                            for (mode, k), c in sorted(calibrated.items(), key=str)}


def load_or_run_grid(run_dir, model, tokenizer, corpus, metrics: xr.Dataset, *, calibrated: dict | None = None,
                     **params) -> xr.Dataset:
    """:func:`run_grid`, cached in ``run_dir`` under a hash of the metrics' provenance, the calibration and ``params``."""
    key = {"metrics": _metrics_key(metrics), "grid": params, "calibrated": _calibration_key(calibrated)}
    return _cached(run_dir, "interventions", key,
                   lambda: run_grid(model, tokenizer, corpus, metrics, calibrated=calibrated, **params))


def load_or_clamp_geometry(run_dir, model, tokenizer, corpus, capture: xr.Dataset, metrics: xr.Dataset, heads, *,
                           calibrated: dict | None = None, **params) -> tuple[pd.DataFrame, xr.Dataset]:
    """:func:`clamp_geometry`, cached in ``run_dir`` like :func:`load_or_run_grid`; ``calibrated`` maps mode -> clamp.

    A calibrated clamp whose calibrating pass captured (``load_or_calibrate(..., recapture=True)``) brings its
    capture along; the others are captured again here.
    """
    from pathlib import Path

    from qkplast.io import open_capture

    key = {"metrics": _metrics_key(metrics), "heads": [list(h) for h in heads], "geometry": params,
           "calibrated": None if calibrated is None else {m: c.attrs.get("clamp_calibration")
                                                          for m, c in sorted(calibrated.items())}}

    recaptured = {}
    for mode, clamp in (calibrated or {}).items():
        name = clamp.attrs.get("clamp_calibration", {}).get("recaptured")
        if name and (Path(run_dir) / name).exists():
            recaptured[mode] = open_capture(Path(run_dir) / name)

    def compute():
        table, profiles = clamp_geometry(model, tokenizer, corpus, capture, metrics, heads, calibrated=calibrated,
                                         recaptured=recaptured, **params)
        ds = profiles.copy()
        for i, col in enumerate(table.columns):
            ds[f"table_{i}"] = ("row", table[col].to_numpy())
        ds.attrs["table_columns"] = list(table.columns)
        return ds

    ds = _cached(run_dir, "clamp-geometry", key, compute)
    cols = ds.attrs["table_columns"]
    table = pd.DataFrame({c: ds[f"table_{i}"].values for i, c in enumerate(cols)})
    return table, ds[["ap"]]
