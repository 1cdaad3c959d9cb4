"""The intervention grid of the chapter "Beyond the thesis: interventions": design, runs, effects, readings.

Behaviour is copying (:func:`qkplast.experiments.behavior.copy_cells`): random segments planted twice into
real windows, one window per document (the independent unit), at set second-copy positions *and* set
distances (:class:`qkplast.experiments.behavior.CopyDesign`), scored by the graded NLL of the repeat beside
its top-1 accuracy. Every effect is a difference from the unablated model's own value in the same window
and cell.

Conditions (:func:`conditions`), for each ``k``: zero-ablation of the ``k`` heads with the lowest and with the
highest ``ap_last20`` (measured on windows of the same length as the behaviour's, so geometry and behaviour
refer to the same positions), each with its own null: ``n_null`` random head sets of the same size and the
same number of heads in every layer (:func:`matched_random_heads`); and both bias clamps
(:func:`qkplast.experiments.intervene.clamp_bias`) of the ``k`` heads with the largest ``|bias_strength|``.
The key clamp removes the keys' drift along the drift axis, the bias pathway ``mu_Q^a alpha_K`` of eq. 4.6
and nothing else of the score; the query clamp sets ``q^a = 0``, which removes the whole ``q^a k^a`` term
(key content along ``a`` included): it is not a bias-only edit and no reading rests on it.

:func:`readings` turns the thesis's causal readings into contrasts with intervals over windows, p-values
(the null sets' rank for the ablations, Student's t over windows otherwise), Holm across the readings and
the verdict rule of :func:`qkplast.stats.decision.verdict`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import xarray as xr

from qkplast.experiments.behavior import CopyDesign, copy_cells
from qkplast.experiments.calibrate import calibrate_clamp, capture_windows
from qkplast.experiments.intervene import InterventionError, ablate_heads, clamp_bias, select_heads
from qkplast.options import CaptureOptions
from qkplast.rundir import cached
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.stats.intervals import t_interval
from qkplast.stats.decision import holm, verdict

__all__ = ["Intervention", "interventions", "format_heads", "parse_heads", "matched_random_heads", "run_grid", "cell_effects",
           "effect_table", "readings", "null_position", "manipulation_checks", "geometry_at_copies",
           "geometry_plan", "geometry_documents", "plot_cells", "plot_effects", "plot_null",
           "load_or_geometry", "load_or_run_grid", "load_or_calibrate", "load_or_manipulation_checks", "READINGS", "NO_EFFECT_MARGIN"]

CLAMP_BY = "bias_strength"
ABLATE_BY = "ap_last20"
#: equivalence margin of the bias clamp's reading, stated before the data: an NLL change within +-0.02 nats per
#: token (about 2% in probability of the copied token) is no effect on copying
NO_EFFECT_MARGIN = 0.02


# --------------------------------------------------------------------------- head lists as text


def format_heads(heads) -> str:
    """Heads ``[(layer, q_head), ...]`` as the text ``"layer.q_head layer.q_head ..."`` (the grid's ``heads`` coord)."""
    return " ".join(f"{int(la)}.{int(h)}" for la, h in heads)


def parse_heads(text: str) -> list[tuple[int, int]]:
    """The heads of :func:`format_heads`'s text, back as ``(layer, q_head)`` pairs; a bad item is an error naming it."""
    out = []
    for item in str(text).split():
        layer, dot, head = item.partition(".")
        if not (dot and layer.isdigit() and head.isdigit()):
            raise InterventionError(f"head {item!r} is not of the form LAYER.Q_HEAD (e.g. 3.5) in {text!r}")
        out.append((int(layer), int(head)))
    return out


# --------------------------------------------------------------------------- conditions


@dataclass
class Intervention:
    """One intervention of the grid.

    ``kind`` is one of "none", "lowest", "highest", "null lowest", "null highest", "clamp key", "clamp query";
    a null set measures only ``sequences`` of the design (its first sequence: one cell per position) and, when
    ``windows`` is set, only the first ``windows`` behaviour windows.
    """

    kind: str
    k: int = 0
    draw: int = -1
    heads: list = field(default_factory=list)
    sequences: tuple | None = None
    windows: int | None = None

    @property
    def mode(self) -> str | None:
        """The clamp mode ("query" or "key") of a clamp condition, else None."""
        return self.kind.split()[1] if self.kind.startswith("clamp") else None

    def context(self, model, metrics, calibrated: dict | None = None):
        """The intervention as a context manager; a clamp uses ``calibrated[(mode, k)]`` when given."""
        if self.mode:
            return clamp_bias(model, (calibrated or {}).get((self.mode, self.k), metrics), self.heads, mode=self.mode)
        return ablate_heads(model, self.heads if self.kind != "none" else [])


def matched_random_heads(metrics: xr.Dataset, heads, n_sets: int, seed=0) -> list[list[tuple[int, int]]]:
    """``n_sets`` random head sets with as many heads in every layer as ``heads`` (same size, same layer mix).

    Set ``s`` draws, in each layer, that layer's count of heads uniformly without replacement from the
    layer's heads in ``metrics``, with ``default_rng([*seed, s])``.
    """
    layer, q_head = metrics["layer"].values.astype(int), metrics["q_head"].values.astype(int)
    counts = pd.Series([la for la, _ in heads]).value_counts().sort_index()
    seed = list(np.atleast_1d(seed))
    out = []
    for s in range(n_sets):
        rng = np.random.default_rng([*seed, s])
        pick = []
        for la, c in counts.items():
            pool = np.flatnonzero(layer == la)
            pick += [(int(la), int(q_head[i])) for i in rng.choice(pool, size=int(c), replace=False)]
        out.append(sorted(pick))
    return out


def interventions(metrics: xr.Dataset, ks: Sequence[int], n_null: int, seed: int = 0,
                  null_windows: int | None = None) -> list[Intervention]:
    """The grid's conditions; the null sets of kind ``K`` for ``k`` use :func:`matched_random_heads` with seed
    ``[seed, k, 0 (lowest) or 1 (highest)]`` and measure the first ``null_windows`` windows (None: all). A ``k``
    beyond the model's heads is capped there."""
    out = [Intervention("none")]
    finite_bias = metrics.isel(head=np.isfinite(metrics["axis_a"].values).all(-1))
    for k in sorted({min(int(k), metrics.sizes["head"]) for k in ks}):
        for j, kind in enumerate(("lowest", "highest")):
            heads = select_heads(metrics, k, ABLATE_BY, largest=kind == "highest")
            out.append(Intervention(kind, k, heads=heads))
            out += [Intervention(f"null {kind}", k, r, h, (0,), null_windows)
                    for r, h in enumerate(matched_random_heads(metrics, heads, n_null, [seed, k, j]))]
        top = select_heads(finite_bias, min(k, finite_bias.sizes["head"]), CLAMP_BY, largest=True, absolute=True)
        out += [Intervention("clamp key", k, heads=top), Intervention("clamp query", k, heads=top)]
    return out


def run_grid(model, tokenizer, windows, metrics: xr.Dataset, *, design: CopyDesign, ks: Sequence[int], n_null: int,
             seed: int = 0, progress: bool = False, calibrated: dict | None = None, batch_size: int = 1,
             null_windows: int | None = None) -> xr.Dataset:
    """Copy ``nll``/``acc`` for every condition: dims ``condition, window, position, distance``.

    ``windows`` are token arrays (:func:`qkplast.experiments.behavior.document_windows`). Coords on
    ``condition``: ``kind``, ``k``, ``draw`` (-1 unless a null set) and ``heads`` (:func:`format_heads`).
    ``calibrated`` maps ``(mode, k)`` to the calibrated clamp of that condition. ``batch_size`` sequences go
    through the model in one forward pass (:func:`~qkplast.experiments.behavior.copy_cells`): the same
    values up to float rounding, faster where the hardware has room (2 on two CPU cores). ``null_windows``: the
    null sets measure only the first that many windows (they are most of the grid's forward passes, and their
    rank p-value's floor, ``1 / (1 + n_null)``, does not depend on the windows); the targeted sets are compared
    with them on those windows (:func:`null_position`). None: every window.
    """
    from qkplast.progress import progress_bar

    if null_windows is not None and not 2 <= int(null_windows) <= len(windows):
        raise InterventionError(f"null_windows must be between 2 and the {len(windows)} behaviour windows (an interval "
                                f"over windows needs two), got {null_windows}")
    conds = interventions(metrics, ks, n_null, seed, null_windows)
    parts = []
    for cond in progress_bar(conds, desc="conditions", enabled=progress):
        with cond.context(model, metrics, calibrated):
            parts.append(copy_cells(model, tokenizer, windows, design, seed, sequences=cond.sequences,
                                    n_windows=cond.windows, batch_size=batch_size))
    grid = xr.concat(parts, dim="condition")
    return grid.assign_coords(
        kind=("condition", [c.kind for c in conds]), k=("condition", [c.k for c in conds]),
        draw=("condition", [c.draw for c in conds]), heads=("condition", [format_heads(c.heads) for c in conds]),
    ).assign_attrs(**{k: v for k, v in parts[0].attrs.items() if k != "sequences"},
                   model=str(getattr(model.config, "_name_or_path", "")), ablate_by=ABLATE_BY,
                   clamp_by=f"|{CLAMP_BY}|", clamp_calibrated=calibrated is not None, n_null=n_null,
                   null_windows=len(windows) if null_windows is None else int(null_windows))


# --------------------------------------------------------------------------- effects and readings


def cell_effects(grid: xr.Dataset, var: str = "nll") -> xr.DataArray:
    """Every condition minus the unablated model in the same window and cell: ``[condition, window, position, distance]``."""
    base = grid[var].sel(condition=grid.kind == "none").isel(condition=0)
    return grid[var] - base


def _seq0(design: CopyDesign) -> list[tuple[int, int]]:
    return design.sequences()[0]


def _mean_cells(eff: xr.DataArray, cells) -> xr.DataArray:
    """Mean over the given (position, distance) cells: dims without position and distance."""
    return xr.concat([eff.sel(position=p, distance=d) for p, d in cells], "cell").mean("cell")


def _design_of(grid: xr.Dataset) -> CopyDesign:
    return CopyDesign(window=int(grid.attrs["window_tokens"]), seg_len=int(grid.attrs["seg_len"]),
                      positions=tuple(int(p) for p in grid.position.values),
                      distances=tuple(int(d) for d in grid.distance.values))


def effect_table(grid: xr.Dataset, var: str = "nll", level: float = 0.95) -> pd.DataFrame:
    """Effects of each targeted condition (not the null sets) per cell, with Student's t intervals over windows.

    Rows: (kind, k, position, distance); columns: the unablated value, the effect, its interval.
    """
    eff = cell_effects(grid, var)
    base = grid[var].sel(condition=grid.kind == "none").isel(condition=0)
    rows = []
    for i in np.flatnonzero(~np.isin(grid.kind.values, ["none", "null lowest", "null highest"])):
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


def null_position(grid: xr.Dataset, kind: str, k: int, var: str = "nll") -> dict:
    """Where the targeted set's effect falls among its null sets, on the cells and windows every null set measured.

    The statistic is the mean effect over those windows and the design's first sequence's cells; the one-sided
    rank p-value of "the targeted set's effect is larger (NLL raised more)" is
    ``(1 + #{null >= targeted}) / (1 + n_null)``, whose floor is ``1 / (1 + n_null)``. ``per_window`` holds
    the targeted minus the null mean on each of those windows.
    """
    cells = _seq0(_design_of(grid))
    eff = _mean_cells(cell_effects(grid, var), cells)  # [condition, window]
    target = eff.sel(condition=(grid.kind == kind) & (grid.k == k)).isel(condition=0).values  # [window]
    null = eff.sel(condition=(grid.kind == f"null {kind}") & (grid.k == k)).values  # [set, window]
    if null.shape[0] == 0:
        raise InterventionError(f"the grid has no null sets for {kind!r} at k={k}; run it with n_null > 0")
    measured = np.isfinite(null).all(0)  # [window]: the windows every null set ran (run_grid's null_windows)
    target, null = target[measured], null[:, measured]
    stat, null_stat = float(np.nanmean(target)), np.nanmean(null, axis=1)  # [set]
    return {"target": stat, "null": null_stat, "n_null": len(null_stat),
            "p": (1 + int(np.sum(null_stat >= stat))) / (1 + len(null_stat)), "floor": 1 / (1 + len(null_stat)),
            "per_window": target - np.nanmean(null, axis=0)}


def _null_interval(grid: xr.Dataset, kind: str, k: int, var: str, level: float) -> dict:
    """Targeted minus null-mean effect with an interval for both sources of variation.

    Two sources: the windows (``per_window`` differences, Student's t over windows) and the choice of
    random sets (the null mean of ``n`` sets varies by ``sd_sets / sqrt(n)``); their variances add.
    """
    pos = null_position(grid, kind, k, var)
    d = pos["per_window"]
    t = t_interval(d, level)
    se = float(np.sqrt(t["se"] ** 2 + np.var(pos["null"], ddof=1) / pos["n_null"]))
    from scipy import stats

    half = float(stats.t.ppf(0.5 + level / 2, max(int(t["n"]) - 1, 1))) * se
    est = pos["target"] - float(np.mean(pos["null"]))
    return {"estimate": est, "lo": est - half, "hi": est + half, "p": pos["p"], "floor": pos["floor"],
            "n_null": pos["n_null"], "rank": int(np.sum(pos["null"] >= pos["target"]))}


#: the thesis's causal readings, their contrasts and predicted signs, in the order they are decided
READINGS = (
    ("lowest", "ablating the heads with the lowest AP_last20 raises copy NLL more than random heads of the same "
               "layers (7.5: low-plasticity heads carry long-range retrieval)", "greater"),
    ("highest", "ablating the heads with the highest AP_last20 raises copy NLL more than random heads of the same "
                "layers (7.6: high-plasticity heads are necessary)", "greater"),
    ("selective", "... and selectively at distance: the NLL effect of ablating the highest heads is larger at the far "
                  "distance than at the near one, the second copy's position held fixed (7.6)", "greater"),
    ("clamp key", "removing the keys' drift along the drift axis (the bias pathway of eq. 4.6) of the most biased "
                  "heads lowers copy NLL at the far distance (7.6)", "less"),
)


def readings(grid: xr.Dataset, level: float = 0.95, alpha: float = 0.05, var: str = "nll") -> pd.DataFrame:
    """The readings of :data:`READINGS` for every ``k``: contrast, interval, p-value, Holm-adjusted p and verdict.

    * ``lowest``/``highest``: targeted minus the mean of its matched null sets on the null's cells; the
      interval combines the windows and the choice of null sets (:func:`_null_interval`); p is the null
      sets' rank (its floor ``1/(1 + n_null)`` is in ``p floor``).
    * ``selective``: for the highest set, effect at the farthest minus at the nearest distance, averaged
      over second-copy positions (each difference at one position); Student's t over windows.
    * ``clamp key``: effect of the key clamp at the farthest distance, averaged over positions; Student's t
      over windows; a whole interval inside +-:data:`NO_EFFECT_MARGIN` is "no effect".

    The verdict (:func:`qkplast.stats.decision.verdict`) needs the interval on the claimed side of zero and
    the Holm-adjusted p below ``alpha`` across all rows.
    """
    eff = cell_effects(grid, var)
    near, far = int(grid.distance.values.min()), int(grid.distance.values.max())
    rows = []
    for k in sorted(set(int(x) for x in grid.k.values if x > 0)):
        one = lambda kind: eff.sel(condition=(grid.kind == kind) & (grid.k == k)).isel(condition=0)  # noqa: E731
        for key, text, claim in READINGS:
            row = {"reading": text, "k": k, "claim": claim, "p floor": np.nan, "margin": np.nan}
            if key in ("lowest", "highest"):
                r = _null_interval(grid, key, k, var, level)
                row.update(measure=f"NLL effect({key}) - mean NLL effect({grid.attrs.get('n_null')} matched null sets)",
                           estimate=r["estimate"], lo=r["lo"], hi=r["hi"], p=r["p"], **{"p floor": r["floor"]})
            else:
                if key == "selective":
                    x = (one("highest").sel(distance=far) - one("highest").sel(distance=near)).mean("position")
                    row["measure"] = f"NLL effect(highest) at distance {far} - at {near}, same position"
                else:
                    x = one("clamp key").sel(distance=far).mean("position")
                    row.update(measure=f"NLL effect(key clamp) at distance {far}", margin=NO_EFFECT_MARGIN)
                t = t_interval(x.values, level)
                row.update(estimate=float(t["estimate"]), lo=float(t["lo"]), hi=float(t["hi"]), p=float(t["p"]))
            rows.append(row)
    out = pd.DataFrame(rows)
    out["p (Holm)"] = holm(out["p"].to_numpy())
    out["verdict"] = [verdict(e, lo, hi, p, claim=c, margin=None if np.isnan(m) else m, alpha=alpha)
                      for e, lo, hi, p, c, m in zip(out.estimate, out.lo, out.hi, out["p (Holm)"], out.claim, out.margin)]
    out.attrs.update(level=level, alpha=alpha, var=var, windows=grid.sizes["window"])
    return out


# --------------------------------------------------------------------------- geometry on the behaviour's window


def geometry_plan(samples_per_bucket: float, geometry_docs: int, min_queries: int = 4) -> tuple[int, int, int]:
    """How many windows the geometry capture takes, and how many of them calibrate the clamps and check them.

    A bucket of one window holds ``samples_per_bucket`` queries in expectation. The clamps are calibrated
    on the first windows and checked on the others (held out), and each group needs at least
    ``min_queries`` sampled positions per bucket, so that no bucket is analysed without queries (a NaN
    geometry row). Returns ``(total, calibration, check)``: ``total`` is ``geometry_docs`` raised to what
    both groups need (the capture then refuses, in one line, a corpus that cannot fill that many windows).
    """
    if samples_per_bucket <= 0 or geometry_docs < 2:
        raise InterventionError(f"the geometry needs samples_per_bucket > 0 and at least 2 windows (one to calibrate "
                                f"on, one held out), got {samples_per_bucket} and {geometry_docs}")
    need = int(np.ceil(min_queries / float(samples_per_bucket)))
    total = max(int(geometry_docs), 2 * need)
    return total, need, total - need


def geometry_documents(capture: xr.Dataset) -> list[str]:
    """The capture's document ids in capture order."""
    return list(dict.fromkeys(capture.doc.values.tolist()))


def geometry_at_copies(metrics: xr.Dataset, heads, design: CopyDesign) -> pd.DataFrame:
    """Mean AP of ``heads`` in the query buckets where the design's second copies sit (the geometry read where the
    behaviour is measured), beside the heads' ``ap_last20`` and the mean over all heads."""
    cap = metrics.attrs.get("capture", {})
    if int(cap.get("seq_len", -1)) != design.window:
        raise InterventionError(f"the metrics were measured on {cap.get('seq_len')}-token windows, the copies sit in "
                                f"{design.window}-token windows: analyse a capture of the behaviour's window length")
    rows = [int(np.flatnonzero((metrics.layer.values == la) & (metrics.q_head.values == h))[0]) for la, h in heads]
    size = int(cap["bucket_size"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = {f"AP at position {p} (bucket {p // size})": [float(np.nanmean(metrics.ap.values[rows, p // size])),
                                                            float(np.nanmean(metrics.ap.values[:, p // size]))]
               for p in design.positions}
        out["ap_last20"] = [float(np.nanmean(metrics.ap_last20.values[rows])), float(np.nanmean(metrics.ap_last20.values))]
    return pd.DataFrame(out, index=["selected heads", "all heads"])


def manipulation_checks(model, tokenizer, documents, capture: xr.Dataset, metrics: xr.Dataset, heads, *,
                        calibrated: dict, check_docs: Sequence[str], analysis: dict | None = None) -> pd.DataFrame:
    """What each calibrated clamp did to the geometry of its heads, on held-out windows: manipulation checks.

    The clamps were calibrated on other windows of ``capture`` (``calibrated[mode]``); here the documents
    ``check_docs`` of ``capture`` are captured again inside each clamp with the capture's own settings
    (positions and heads are seeded by document, so the plain values are the capture's own on the same
    documents) and analysed like the run. One row per (mode, head): ``bias_strength`` and
    ``key_position_slope`` plain and clamped, ``ap_last20`` plain and clamped.

    Removing the drift term raises the closed-form plasticity almost by construction, so these rows show
    that the manipulation took hold; they are not evidence for the behavioural readings.
    """
    from qkplast.analysis.metrics import analyze
    from qkplast.capture.driver import capture as run_capture

    options = _capture_settings(capture, len(check_docs))
    held = [doc for doc in documents if doc.id in set(check_docs)]
    rows_of = lambda ds: [int(np.flatnonzero((ds.layer.values == la) & (ds.q_head.values == h))[0])  # noqa: E731
                          for la, h in heads]
    plain_cap = capture.isel(sample=np.isin(capture.doc.values, list(check_docs)))
    plain_cap.attrs = dict(capture.attrs, n_docs=len(check_docs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)  # bucket 0 has no earlier keys, as in the run
        plain = analyze(plain_cap.isel(head=rows_of(plain_cap)), **(analysis or {}))
        clamped = {}
        for mode, clamp in calibrated.items():
            with clamp_bias(model, clamp, heads, mode=mode):
                again = run_capture(model, tokenizer, held, options=options, progress=False)
            if list(np.unique(again.doc.values)) != sorted(check_docs):
                raise InterventionError(f"the {mode} clamp's re-capture read {sorted(set(again.doc.values))}, not the "
                                        f"held-out documents {sorted(check_docs)}")
            clamped[mode] = analyze(again.isel(head=rows_of(again)), **(analysis or {}))
    out = []
    for mode, m in clamped.items():
        for i, (la, h) in enumerate(heads):
            out.append({"mode": mode, "layer": la, "q_head": h,
                        "bias_strength plain": float(plain.bias_strength[i]), "bias_strength clamped": float(m.bias_strength[i]),
                        "key_position_slope plain": float(plain.key_position_slope[i]),
                        "key_position_slope clamped": float(m.key_position_slope[i]),
                        "ap_last20 plain": float(plain.ap_last20[i]), "ap_last20 clamped": float(m.ap_last20[i])})
    table = pd.DataFrame(out)
    table.attrs["documents"] = list(check_docs)
    return table


def _capture_settings(capture: xr.Dataset, docs: int) -> CaptureOptions:
    """The settings ``capture`` recorded (``docs`` windows), so a re-capture differs only by the intervention."""
    attrs = capture.attrs
    return CaptureOptions(seq_len=int(attrs["seq_len"]), bucket_size=int(attrs["bucket_size"]),
                          samples_per_bucket=float(attrs["samples_per_bucket"]),
                          min_per_bucket=int(attrs["min_per_bucket"]), heads=attrs.get("heads"),
                          seed=int(attrs["seed"]), docs=docs, short_docs=attrs["short_docs"])


CALIBRATED = ("axis_a", "alpha_k", "mu_q_a", "bias_strength", "key_drift")


def calibrate_clamps(model, tokenizer, documents, capture: xr.Dataset, metrics: xr.Dataset, *, ks: Sequence[int],
                     calibration_docs: Sequence[str], seed: int = 0) -> dict:
    """Every clamp condition of the grid calibrated (:func:`qkplast.experiments.calibrate.calibrate_clamp`) on the
    windows of ``calibration_docs`` (documents of ``capture``), at the capture's own sampled positions: one
    forward pass per condition, each clamped layer measured with the clamped layers below it clamped.

    Returns ``{(mode, k): calibrated metrics}``.
    """
    options = _capture_settings(capture, len(calibration_docs))
    chosen = [doc for doc in documents if doc.id in set(calibration_docs)]
    ids, mask = capture_windows(tokenizer, chosen, options)
    return {(c.mode, c.k): calibrate_clamp(model, metrics, c.heads, ids, mode=c.mode, positions=mask)
            for c in interventions(metrics, ks, 0, seed) if c.mode}


# --------------------------------------------------------------------------- figures


def _fig(ncols=1, width=6.4, height=4.0):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False, layout="constrained")
    return fig, axes[0]


STYLE = {"none": ("k", "-o"), "lowest": ("tab:blue", "-s"), "highest": ("tab:red", "-^"),
         "clamp query": ("tab:green", "--D"), "clamp key": ("tab:purple", "--v")}


def plot_cells(grid: xr.Dataset, k: int, var: str = "nll"):
    """Mean ``var`` by distance, one panel per second-copy position, under each targeted condition at ``k``."""
    k = min(int(k), int(grid.k.max()))
    positions = grid.position.values
    fig, axes = _fig(len(positions), width=4.2)
    mean = grid[var].mean("window")
    d = grid.distance.values
    for ax, p in zip(axes, positions):
        for kind in ("none", "lowest", "highest", "clamp key", "clamp query"):
            sel = (grid.kind == kind) & ((grid.k == k) | (grid.kind == "none"))
            color, style = STYLE[kind]
            ax.plot(d, mean.sel(condition=sel, position=p).isel(condition=0), style, color=color, ms=4,
                    label="no intervention" if kind == "none" else f"{kind} (k = {k})")
        ax.set(xlabel="distance between the copies (tokens)", title=f"second copy at token {p}",
               ylabel="NLL of the repeat (nats/token)" if var == "nll" else "top-1 copy accuracy")
    axes[0].legend(fontsize=7)
    return fig


def plot_null(grid: xr.Dataset, k: int, var: str = "nll"):
    """Each targeted ablation's effect against the effects of its matched null sets (one dot per set)."""
    fig, (ax,) = _fig(height=3.2)
    for y, kind in enumerate(("lowest", "highest")):
        pos = null_position(grid, kind, k, var)
        ax.scatter(pos["null"], np.full(pos["n_null"], y) + np.linspace(-0.15, 0.15, pos["n_null"]), s=10, color="0.5",
                   label="matched random sets" if y == 0 else None)
        ax.scatter([pos["target"]], [y], s=60, marker="D", color=STYLE[kind][0], label=f"{kind} AP_last20")
    ax.set_yticks([0, 1], ["lowest", "highest"])
    ax.set(xlabel=f"NLL effect, mean over windows and the null's cells (k = {k})", title="targeted sets and their nulls")
    ax.legend(fontsize=7)
    return fig


def plot_effects(table: pd.DataFrame):
    """Effects with their intervals per condition and cell."""
    fig, (ax,) = _fig(height=3.8)
    t = table.reset_index(drop=True)
    y = np.arange(len(t))
    for yi, row in zip(y, t.itertuples()):
        ax.errorbar(row.effect, yi, xerr=[[row.effect - row.lo], [row.hi - row.effect]], fmt="o",
                    color=STYLE[row.kind][0], capsize=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(y, [f"{r.kind}, k={r.k}, at {r.position}, d={r.distance}" for r in t.itertuples()], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel=f"change in {table.attrs.get('var', 'nll')} vs no intervention (same window and cell)",
           title=f"effects with {int(100 * table.attrs.get('level', 0.95))}% t intervals over windows")
    return fig


#: Version of the products this module caches in a run directory (grid, calibration, manipulation checks,
#: geometry capture): bump it when one of them changes, so a run recomputes it instead of reusing a stale one.
SCHEMA_VERSION = 2


def _metrics_key(metrics: xr.Dataset) -> dict:
    cap = metrics.attrs.get("capture", {})
    return {"model": cap.get("model"), "model_info": cap.get("model_info"), "seq_len": cap.get("seq_len"),
            "n_docs": cap.get("n_docs"), "seed": cap.get("seed"), "options": metrics.attrs.get("options")}


def _calibration_key(calibrated: dict | None):
    return None if calibrated is None else {f"{mode} {k}": c.attrs.get("clamp_calibration")
                                            for (mode, k), c in sorted(calibrated.items(), key=str)}


def load_or_geometry(run_dir, model, tokenizer, documents, options: CaptureOptions, analysis: dict) -> tuple[xr.Dataset, xr.Dataset]:
    """The capture with ``options`` (the behaviour's window length) and its analysis, each cached in ``run_dir``.

    ``documents`` is the run's corpus, opened with its settings; ``model`` is a loaded causal LM (the one the
    interventions use, so no second load).
    """
    from qkplast.analysis.metrics import analyze
    from qkplast.capture.driver import capture as run_capture

    from qkplast.analysis.metrics import SCHEMA_VERSION as METRICS_SCHEMA

    key = {"capture": options.to_dict(), "model": str(getattr(model.config, "_name_or_path", "")), "schema": SCHEMA_VERSION}
    cap = cached(run_dir, "interventions-geometry-capture", key,
                  lambda: run_capture(model, tokenizer, documents, options=options, progress=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)  # bucket 0 has no earlier keys, as in the run
        metrics = cached(run_dir, "interventions-geometry-metrics", {**key, "analysis": analysis,
                                                                     "metrics_schema": METRICS_SCHEMA},
                          lambda: analyze(cap, **analysis))
    return cap, metrics


def load_or_run_grid(run_dir, model, tokenizer, windows, metrics: xr.Dataset, *, calibrated: dict | None = None,
                     **params) -> xr.Dataset:
    """:func:`run_grid`, cached in ``run_dir`` under a hash of the metrics' provenance, the calibration and ``params``."""
    key = {"metrics": _metrics_key(metrics), "grid": {k: (v.__dict__ if isinstance(v, CopyDesign) else v)
                                                      for k, v in params.items()},
           "windows": [int(np.asarray(w, dtype=np.int64).sum() % (2**31)) for w in windows],
           "calibrated": _calibration_key(calibrated), "schema": SCHEMA_VERSION}
    return cached(run_dir, "interventions", key,
                   lambda: run_grid(model, tokenizer, windows, metrics, calibrated=calibrated, **params))


def load_or_calibrate(run_dir, model, tokenizer, documents, capture: xr.Dataset, metrics: xr.Dataset, *,
                      ks: Sequence[int], calibration_docs: Sequence[str], seed: int = 0) -> dict:
    """:func:`calibrate_clamps`, cached in ``run_dir``: the calibrated variables of every (mode, k) in one file."""
    key = {"metrics": _metrics_key(metrics), "calibration": {"ks": list(ks), "docs": list(calibration_docs), "seed": seed},
           "schema": SCHEMA_VERSION}

    def compute():
        cal = calibrate_clamps(model, tokenizer, documents, capture, metrics, ks=ks, calibration_docs=calibration_docs,
                               seed=seed)
        labels = list(cal)
        return xr.Dataset(
            {name: (("clamp", *metrics[name].dims) if name in metrics else ("clamp", "head", "dim"),
                    np.stack([cal[c][name].values for c in labels])) for name in CALIBRATED},
            coords={"clamp_mode": ("clamp", [m for m, _ in labels]), "clamp_k": ("clamp", [k for _, k in labels])},
            attrs={"calibration": [cal[c].attrs["clamp_calibration"] for c in labels]})

    ds = cached(run_dir, "clamp-calibration", key, compute)
    out = {}
    for i, (mode, k) in enumerate(zip(ds.clamp_mode.values, ds.clamp_k.values)):
        one = metrics.copy()
        for name in CALIBRATED:
            one[name] = (ds[name].dims[1:], ds[name].values[i])
        one.attrs = dict(metrics.attrs, clamp_calibration=ds.attrs["calibration"][i])
        out[(str(mode), int(k))] = one
    return out


def load_or_manipulation_checks(run_dir, model, tokenizer, documents, capture: xr.Dataset, metrics: xr.Dataset, heads,
                                *, calibrated: dict, check_docs: Sequence[str], analysis: dict | None = None) -> pd.DataFrame:
    """:func:`manipulation_checks`, cached in ``run_dir`` like :func:`load_or_run_grid`."""
    key = {"metrics": _metrics_key(metrics), "heads": [list(h) for h in heads], "check_docs": list(check_docs),
           "analysis": analysis, "calibrated": {m: c.attrs.get("clamp_calibration") for m, c in sorted(calibrated.items())},
           "schema": SCHEMA_VERSION}

    def compute():
        table = manipulation_checks(model, tokenizer, documents, capture, metrics, heads, calibrated=calibrated,
                                    check_docs=check_docs, analysis=analysis)
        ds = xr.Dataset({f"table_{i}": ("row", table[c].to_numpy()) for i, c in enumerate(table.columns)})
        ds.attrs["table_columns"] = list(table.columns)
        return ds

    ds = cached(run_dir, "clamp-manipulation", key, compute)
    return pd.DataFrame({c: ds[f"table_{i}"].values for i, c in enumerate(ds.attrs["table_columns"])})
