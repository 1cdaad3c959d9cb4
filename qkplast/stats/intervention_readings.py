"""Readings of the intervention grid (chapter "Beyond the thesis: interventions"): effects, the functional check,
each registered reading against its matched null sets, Holm and the verdict.

The grid (:func:`qkplast.experiments.head_interventions.run_grid`) holds copy ``nll``/``acc`` with dims ``condition, window,
position, distance`` and the coords ``kind``, ``k``, ``draw`` and ``heads`` on ``condition``; its ``vocab`` attr sets
the functional check's scale. Every effect is a difference from the unablated model's own value in the same window
and cell (:func:`cell_effects`).

The readings, the decision rule, the k rule, the functional check and the default design are registered in
``studies/interventions-readings.yaml`` (:func:`load_readings`). :func:`readings` gates each reading on the
functional check (:func:`functional_check`, :func:`gate`), sets the targeted statistic against its null sets on the
same cells and windows (:func:`against_null`, a parametric tail whose rank p is shown beside it), corrects across the
readings with Holm and words the verdict with :func:`qkplast.stats.decision.verdict`. The k rule's decision on a
pilot is :func:`choose_k`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from qkplast.errors import QkplastError
from qkplast.stats.intervals import t_interval
from qkplast.stats.decision import NOT_TESTABLE, holm, verdict
from qkplast.stats.nulls import null_tail_test, tail_detectable

__all__ = ["ReadingError", "load_readings", "working_threshold", "choose_k", "cell_effects", "functional_check", "gate",
           "against_null", "null_position", "effect_table", "plasticity_change", "readings", "READINGS_FILE",
           "STATISTICS"]


class ReadingError(QkplastError):
    """A registered reading that cannot be read as asked (the message names the fix)."""


# --------------------------------------------------------------------------- the registration and the k rule

READINGS_FILE = "interventions-readings.yaml"
CLAIMS = ("greater", "less")


def load_readings(path=None) -> dict:
    """Chapter 12's registration, ``studies/interventions-readings.yaml`` (or ``path``): readings, rules, design.

    Returns the whole document; ``readings`` maps each key to its ``text``, ``statistic``, ``target`` and ``null_sets``
    conditions, ``claim`` and optional ``margin``. A reading without those, or with another claim, is an error
    naming it.
    """
    import yaml

    from qkplast.resources import resource_dir

    path = Path(path) if path is not None else resource_dir("studies") / READINGS_FILE
    document = yaml.safe_load(Path(path).read_text())
    for key, spec in document.get("readings", {}).items():
        missing = [f for f in ("text", "statistic", "target", "null_sets", "claim") if f not in spec]
        if missing or spec["claim"] not in CLAIMS or key not in STATISTICS:
            raise ReadingError(f"reading {key!r} of {path}: needs text, statistic, target, null_sets and a claim in "
                               f"{CLAIMS}, and a key in {sorted(STATISTICS)} (missing {missing}, claim "
                               f"{spec.get('claim')!r})")
    return document


def working_threshold(vocab: int, fraction: float) -> float:
    """The functional check's threshold: ``fraction * ln V`` nats per token (``ln V``: a uniform guess)."""
    return float(fraction) * float(np.log(vocab))


def choose_k(pilot: xr.Dataset) -> int:
    """The largest ``k`` whose median pilot set keeps the model working (mean NLL below the threshold); the
    smallest candidate when none does (the gates then say the model broke)."""
    median = np.median(pilot["nll"].values, axis=1)  # [k]
    ok = pilot.k.values[median < float(pilot.attrs["threshold"])]
    return int(ok.max()) if ok.size else int(pilot.k.values.min())


# --------------------------------------------------------------------------- effects, the functional check, readings


def cell_effects(grid: xr.Dataset, var: str = "nll") -> xr.DataArray:
    """Every condition minus the unablated model in the same window and cell: ``[condition, window, position, distance]``."""
    base = grid[var].sel(condition=grid.kind == "none").isel(condition=0)
    return grid[var] - base


def _nanmean(x: xr.DataArray, dims) -> xr.DataArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a null set's unmeasured windows: NaN, not a warning
        return x.mean(dims, skipna=True)


def functional_check(grid: xr.Dataset, fraction: float, var: str = "nll") -> pd.DataFrame:
    """Whether every condition keeps the model working: its mean copy NLL over the cells and windows it measured
    below :func:`working_threshold` (``fraction * ln V``, V the grid's ``vocab``). One row per condition."""
    mean = _nanmean(grid[var], ("window", "position", "distance")).values  # [condition]
    threshold = working_threshold(int(grid.attrs["vocab"]), fraction)
    out = pd.DataFrame({"kind": grid.kind.values.astype(str), "k": grid.k.values.astype(int),
                        "draw": grid.draw.values.astype(int), "mean NLL": mean, "working": mean < threshold})
    out.attrs.update(threshold=threshold, fraction=fraction, vocab=int(grid.attrs["vocab"]))
    return out


def gate(check: pd.DataFrame, target: str, null: str, k: int) -> str | None:
    """None when the targeted condition and the median of its null sets keep the model working, else the
    verdict word "not testable (gate: model broken)" (:data:`qkplast.stats.decision.NOT_TESTABLE`)."""
    one = check[(check.k == k) | (check.kind == "none")]
    t = one[one.kind == target]
    n = one[one.kind == null]
    broken = (t.empty or not bool(t.working.iloc[0]) or n.empty
              or not float(np.median(n["mean NLL"])) < float(check.attrs["threshold"]))
    return f"{NOT_TESTABLE} (gate: model broken)" if broken else None


def _statistic(grid: xr.Dataset, key: str, var: str = "nll") -> xr.DataArray:
    """Reading ``key``'s statistic per condition and window, ``[condition, window]`` (NaN where not measured)."""
    eff = cell_effects(grid, var)
    near, far = int(grid.distance.values.min()), int(grid.distance.values.max())
    if key in ("lowest", "highest"):
        return eff.mean(("position", "distance"))
    if key == "selective":
        return (eff.sel(distance=far) - eff.sel(distance=near)).mean("position")
    if key == "clamp key":
        return eff.sel(distance=far).mean("position")
    raise ReadingError(f"no behavioural statistic for reading {key!r}")


#: the readings whose statistic the grid holds (the plasticity reading's comes from the clamp checks)
STATISTICS = ("lowest", "highest", "selective", "clamp key", "clamp plasticity")


def against_null(grid: xr.Dataset, key: str, target: str, null: str, k: int, *, claim: str = "greater",
                 var: str = "nll", level: float = 0.95) -> dict:
    """Reading ``key``'s statistic of the ``target`` condition against its ``null`` sets, on the cells and windows
    every null set measured: :func:`qkplast.stats.nulls.null_tail_test` with the per-window contrast, plus
    ``target``, ``null`` (per set) and ``per_window``."""
    stat = _statistic(grid, key, var)
    t = stat.sel(condition=(grid.kind == target) & (grid.k == k)).isel(condition=0).values  # [window]
    n = stat.sel(condition=(grid.kind == null) & (grid.k == k)).values  # [set, window]
    if n.shape[0] < 2:
        raise ReadingError(f"the grid has {n.shape[0]} null sets for {target!r} at k={k}; run it with n_null >= 2")
    measured = np.isfinite(n).all(0) & np.isfinite(t)  # [window]: the windows every null set ran
    t, n = t[measured], n[:, measured]
    per_window = t - n.mean(0)
    r = null_tail_test(float(t.mean()), n.mean(1), per_window if per_window.size >= 2 else None,
                       alternative=claim, level=level)
    return {**r, "target": float(t.mean()), "null": n.mean(1), "per_window": per_window}


def null_position(grid: xr.Dataset, kind: str, k: int, var: str = "nll") -> dict:
    """Where a targeted ablation's mean effect over every cell falls among its null sets (on the windows they
    measured): ``target``, ``null`` (per set), ``n_null``, the rank ``p`` ("larger") and its ``floor``."""
    r = against_null(grid, kind, kind, f"null {kind}", k, var=var)
    return {"target": r["target"], "null": r["null"], "n_null": r["n_null"], "p": r["p_rank"], "floor": r["floor"],
            "per_window": r["per_window"]}


def effect_table(grid: xr.Dataset, var: str = "nll", level: float = 0.95) -> pd.DataFrame:
    """Effects of each targeted condition (not the null sets) per cell, with Student's t intervals over windows.

    Rows: (kind, k, position, distance); columns: the unablated value, the effect, its interval.
    """
    eff = cell_effects(grid, var)
    base = grid[var].sel(condition=grid.kind == "none").isel(condition=0)
    rows = []
    for i in np.flatnonzero(~(grid.kind.str.startswith("null").values | (grid.kind == "none").values)):
        for p in grid.position.values:
            for d in grid.distance.values:
                e = eff.isel(condition=i).sel(position=p, distance=d).values  # [window]
                t = t_interval(e, level)
                rows.append({"kind": str(grid.kind.values[i]), "k": int(grid.k.values[i]), "position": int(p),
                             "distance": int(d), "unablated": float(np.nanmean(base.sel(position=p, distance=d))),
                             "effect": float(t["estimate"]), "lo": float(t["lo"]), "hi": float(t["hi"])})
    out = pd.DataFrame(rows)
    out.attrs.update(var=var, level=level, method=f"Student's t over {grid.sizes['window']} windows (one per document)")
    return out


def plasticity_change(checks: pd.DataFrame, mode: str = "key") -> float:
    """Mean over a clamp's heads of ``ap_last20`` clamped minus plain (:func:`qkplast.experiments.head_interventions.manipulation_checks`)."""
    g = checks[checks["mode"] == mode]
    return float(np.mean(g["ap_last20 clamped"] - g["ap_last20 plain"]))


def readings(grid: xr.Dataset, registration: dict | None = None, *, plasticity: dict | None = None,
             var: str = "nll") -> pd.DataFrame:
    """The registered readings (:func:`load_readings`) for every ``k``: gate, contrast with its null, interval,
    p-values, Holm-adjusted p, smallest detectable effect and verdict.

    Each reading's statistic (:func:`_statistic`; for "clamp plasticity" the mean ``ap_last20`` change of the
    clamped heads, ``plasticity = {"target": float, "null": [set]}`` per k, or ``{k: {...}}``) of its targeted
    condition is set against the same statistic of its null sets (:func:`against_null`, the parametric tail of
    :func:`qkplast.stats.nulls.null_tail_test`, its two-sided p decided with, as
    :func:`~qkplast.stats.decision.verdict` takes it); the one-sided rank p and its floor are shown beside it. A reading whose
    gate fails (:func:`gate`) reads "not testable (gate: model broken)" and leaves the Holm family; the others
    form one family (:func:`qkplast.stats.decision.holm`), decided by :func:`qkplast.stats.decision.verdict`. A
    plasticity reading without ``plasticity`` is left out. ``detectable``: the smallest contrast the reading
    detects with power 0.8 at level ``alpha / m`` (Holm's first step).
    """
    reg = registration if registration is not None else load_readings()
    level, alpha = float(reg.get("level", 0.95)), float(reg.get("alpha", 0.05))
    check = functional_check(grid, float(reg["working_fraction"]), var)
    rows = []
    for k in sorted(set(int(x) for x in grid.k.values if x > 0)):
        for key, spec in reg["readings"].items():
            if key == "clamp plasticity" and plasticity is None:
                continue
            row = {"key": key, "reading": spec["text"], "k": k, "claim": spec["claim"], "measure": spec["statistic"],
                   "margin": float(spec.get("margin", np.nan)), "gate": gate(check, spec["target"], spec["null_sets"], k)}
            if row["gate"] is None:
                if key == "clamp plasticity":
                    one = plasticity.get(k, plasticity) if isinstance(plasticity, dict) else plasticity
                    r = null_tail_test(one["target"], one["null"], alternative=spec["claim"], level=level)
                else:
                    r = against_null(grid, key, spec["target"], spec["null_sets"], k, claim=spec["claim"], var=var,
                                     level=level)
                row.update({c: r[c] for c in ("estimate", "lo", "hi", "se", "df", "p", "n_null")},
                           **{"p rank": r["p_rank"], "p floor": r["floor"]})
            rows.append(row)
    out = pd.DataFrame(rows).reindex(columns=["key", "reading", "k", "claim", "measure", "gate", "estimate", "lo", "hi",
                                              "se", "df", "n_null", "p", "p rank", "p floor", "margin"])
    out["p (Holm)"] = holm(out["p"].to_numpy(dtype=float))
    m = int(np.isfinite(out["p"].to_numpy(dtype=float)).sum())
    out["detectable"] = [tail_detectable(se, df, alpha / m) if m and np.isfinite(se) else np.nan
                         for se, df in zip(out.se.astype(float), out.df.astype(float))]
    out["verdict"] = [g if isinstance(g, str) else
                      verdict(e, lo, hi, p, claim=c, margin=None if np.isnan(mg) else mg, alpha=alpha)
                      for g, e, lo, hi, p, c, mg in zip(out.gate, out.estimate, out.lo, out.hi, out["p (Holm)"],
                                                        out.claim, out.margin)]
    out.attrs.update(level=level, alpha=alpha, var=var, m=m, threshold=check.attrs["threshold"],
                     windows=int(grid.attrs.get("null_windows", grid.sizes["window"])))
    return out
