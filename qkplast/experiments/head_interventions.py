"""The intervention grid of the chapter "Beyond the thesis: interventions": its conditions, runs, calibration,
geometry and caches.

Behaviour is copying (:func:`qkplast.experiments.behavior.copy_cells`): random segments planted twice into
real windows, one window per document (the independent unit), at set second-copy positions *and* set
distances (:class:`qkplast.experiments.behavior.CopyDesign`), scored by the graded NLL of the repeat beside
its top-1 accuracy. Every effect is a difference from the unablated model's own value in the same window
and cell.

Conditions (:func:`interventions`), for the ``k`` of the k rule (:func:`pilot_k`): ablation (mean by default:
the head's output replaced by its mean over reference windows) of the ``k`` heads with the lowest and with the
highest ``ap_last20`` (measured on windows of the same length as the behaviour's, so geometry and behaviour
refer to the same positions), each with its own null: ``n_null`` random head sets of the same size and the
same number of heads in every layer (:func:`matched_random_heads`); and both bias clamps
(:func:`qkplast.experiments.intervene.clamp_bias`) of the ``k`` heads with the largest ``|bias_strength|``, the
key clamp with its null: the same calibrated key clamp on random heads of the same layers, each removing its own
drift (:func:`calibrate_clamps`).
The key clamp removes the keys' drift along the drift axis, the bias pathway ``mu_Q^a alpha_K`` of eq. 4.6
and nothing else of the score; the query clamp sets ``q^a = 0``, which removes the whole ``q^a k^a`` term
(key content along ``a`` included): it is not a bias-only edit and no reading rests on it.

The readings, the decision rule, the k rule, the functional check and the default design are registered in
``studies/interventions-readings.yaml``; the grid's readings (effects, the functional check, each reading against
its null sets, Holm and the verdict) are :mod:`qkplast.stats.intervention_readings`, its figures
:mod:`qkplast.results.intervention_figures`.
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
from qkplast.stats.intervention_readings import choose_k, plasticity_change, working_threshold

__all__ = ["Intervention", "interventions", "format_heads", "parse_heads", "matched_random_heads", "clamp_label",
           "clamp_size", "run_grid", "pilot_k", "manipulation_checks", "null_clamp_plasticity", "geometry_at_copies",
           "geometry_plan", "geometry_documents", "load_or_geometry", "load_or_run_grid", "load_or_calibrate",
           "load_or_manipulation_checks", "load_or_pilot", "load_or_mean_outputs", "load_or_null_clamp_plasticity"]

CLAMP_BY = "bias_strength"
ABLATE_BY = "ap_last20"


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

    ``kind`` is one of "none", "lowest", "highest", "null lowest", "null highest", "clamp key", "clamp query",
    "null clamp key"; a null set measures every cell of the design (``sequences`` None) and, when ``windows`` is
    set, only the first ``windows`` behaviour windows. ``clamp`` holds the clamp metrics of a null clamp set
    (its own calibrated drift, :func:`calibrate_clamps`; the plain metrics when not calibrated).
    """

    kind: str
    k: int = 0
    draw: int = -1
    heads: list = field(default_factory=list)
    sequences: tuple | None = None
    windows: int | None = None
    clamp: xr.Dataset | None = field(default=None, repr=False)

    @property
    def mode(self) -> str | None:
        """The clamp mode ("query" or "key") of a clamp condition or null clamp set, else None."""
        words = self.kind.split()
        return words[-1] if "clamp" in words else None

    def context(self, model, metrics, calibrated: dict | None = None, *, ablation: str = "zero", reference=None):
        """The intervention as a context manager; a clamp uses ``calibrated[(mode, k)]`` when given (a null clamp
        set its own ``clamp``); an ablation is ``ablation`` ("zero" or "mean" over ``reference``, a
        :func:`~qkplast.experiments.intervene.head_mean_outputs` array)."""
        if self.mode:
            clamp = self.clamp if self.clamp is not None else (calibrated or {}).get((self.mode, self.k), metrics)
            return clamp_bias(model, clamp, self.heads, mode=self.mode)
        heads = self.heads if self.kind != "none" else []
        if ablation == "mean" and heads:
            return ablate_heads(model, heads, mode="mean", reference=reference)
        return ablate_heads(model, heads)


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


def clamp_size(metrics: xr.Dataset, heads) -> np.ndarray:
    """Drift per token a key clamp of ``heads`` removes from each one's key head: ``|key_drift|`` of a calibrated
    clamp (:func:`qkplast.experiments.calibrate.calibrate_clamp`), else ``|alpha_K|``. ``[head]``."""
    idx = {(int(la), int(h)): i for i, (la, h) in enumerate(zip(metrics.layer.values, metrics.q_head.values))}
    rows = [idx[(int(la), int(h))] for la, h in heads]
    if "key_drift" in metrics:
        return np.linalg.norm(np.asarray(metrics["key_drift"].values, np.float64)[rows], axis=-1)
    return np.abs(np.asarray(metrics["alpha_k"].values, np.float64)[rows])


def interventions(metrics: xr.Dataset, ks: Sequence[int], n_null: int, seed: int = 0,
                  null_windows: int | None = None, calibrated: dict | None = None) -> list[Intervention]:
    """The grid's conditions; the null sets of kind ``K`` for ``k`` use :func:`matched_random_heads` with seed
    ``[seed, k, 0 (lowest), 1 (highest) or 3 (clamp key)]`` and measure every cell of the first ``null_windows``
    windows (None: all). The null clamp sets are drawn among heads with a drift axis in the targeted clamp's
    layers, each clamped on its own drift: ``calibrated[("null key", k, draw)]`` when given
    (:func:`calibrate_clamps` with ``n_null``), else the plain ``metrics``. The null is the same edit (the bias
    pathway removed, calibrated the same way) on other heads of the same layers; its size is each head's own (a
    drift of the targeted heads' size added to heads that have little of it injects a bias they never had, and
    broke the model in a first execution: ``studies/interventions-readings.yaml``, amendment). A ``k`` beyond the
    model's heads is capped there."""
    out = [Intervention("none")]
    finite_bias = metrics.isel(head=np.isfinite(metrics["axis_a"].values).all(-1) & np.isfinite(metrics["alpha_k"].values))
    for k in sorted({min(int(k), metrics.sizes["head"]) for k in ks}):
        for j, kind in enumerate(("lowest", "highest")):
            heads = select_heads(metrics, k, ABLATE_BY, largest=kind == "highest")
            out.append(Intervention(kind, k, heads=heads))
            out += [Intervention(f"null {kind}", k, r, h, None, null_windows)
                    for r, h in enumerate(matched_random_heads(metrics, heads, n_null, [seed, k, j]))]
        top = select_heads(finite_bias, min(k, finite_bias.sizes["head"]), CLAMP_BY, largest=True, absolute=True)
        out += [Intervention("clamp key", k, heads=top), Intervention("clamp query", k, heads=top)]
        out += [Intervention("null clamp key", k, r, h, None, null_windows,
                             clamp=(calibrated or {}).get(("null key", k, r), metrics))
                for r, h in enumerate(matched_random_heads(finite_bias, top, n_null, [seed, k, 3]))]
    return out


def run_grid(model, tokenizer, windows, metrics: xr.Dataset, *, design: CopyDesign, ks: Sequence[int], n_null: int,
             seed: int = 0, progress: bool = False, calibrated: dict | None = None, batch_size: int = 1,
             null_windows: int | None = None, ablation: str = "zero", reference=None) -> xr.Dataset:
    """Copy ``nll``/``acc`` for every condition: dims ``condition, window, position, distance``.

    ``windows`` are token arrays (:func:`qkplast.experiments.behavior.document_windows`). Coords on
    ``condition``: ``kind``, ``k``, ``draw`` (-1 unless a null set) and ``heads`` (:func:`format_heads`).
    ``calibrated`` maps ``(mode, k)`` to the calibrated clamp of that condition. ``batch_size`` sequences go
    through the model in one forward pass (:func:`~qkplast.experiments.behavior.copy_cells`): the same
    values up to float rounding, faster where the hardware has room (2 on two CPU cores). ``null_windows``: the
    null sets measure every cell of only the first that many windows (they are most of the grid's forward
    passes); the targeted sets are compared with them on those windows. None: every window. ``ablation``:
    "zero", or "mean" with ``reference`` the heads' mean outputs over reference windows
    (:func:`~qkplast.experiments.intervene.head_mean_outputs`, never the behaviour windows). The grid's
    ``vocab`` attr (the model's vocabulary) sets the functional check's scale
    (:func:`~qkplast.stats.intervention_readings.functional_check`).
    """
    from qkplast.progress import progress_bar

    if null_windows is not None and not 2 <= int(null_windows) <= len(windows):
        raise InterventionError(f"null_windows must be between 2 and the {len(windows)} behaviour windows (an interval "
                                f"over windows needs two), got {null_windows}")
    if ablation not in ("zero", "mean") or (ablation == "mean") != (reference is not None):
        raise InterventionError(f"ablation must be 'zero' (no reference) or 'mean' with reference= the heads' mean "
                                f"outputs (head_mean_outputs), got {ablation!r} with reference "
                                f"{'given' if reference is not None else 'None'}")
    conds = interventions(metrics, ks, n_null, seed, null_windows, calibrated)
    parts = []
    for cond in progress_bar(conds, desc="conditions", enabled=progress):
        with cond.context(model, metrics, calibrated, ablation=ablation, reference=reference):
            parts.append(copy_cells(model, tokenizer, windows, design, seed, sequences=cond.sequences,
                                    n_windows=cond.windows, batch_size=batch_size))
    grid = xr.concat(parts, dim="condition")
    return grid.assign_coords(
        kind=("condition", [c.kind for c in conds]), k=("condition", [c.k for c in conds]),
        draw=("condition", [c.draw for c in conds]), heads=("condition", [format_heads(c.heads) for c in conds]),
    ).assign_attrs(**{k: v for k, v in parts[0].attrs.items() if k != "sequences"},
                   model=str(getattr(model.config, "_name_or_path", "")), ablate_by=ABLATE_BY, ablation=ablation,
                   clamp_by=f"|{CLAMP_BY}|", clamp_calibrated=calibrated is not None, n_null=n_null,
                   vocab=int(model.config.get_text_config().vocab_size),
                   null_windows=len(windows) if null_windows is None else int(null_windows))


# --------------------------------------------------------------------------- the k rule's pilot


def pilot_k(model, tokenizer, windows, design: CopyDesign, metrics: xr.Dataset, *, candidates: Sequence[int],
            n_sets: int, fraction: float, seed: int = 0, ablation: str = "mean", reference=None,
            batch_size: int = 1) -> xr.Dataset:
    """The k rule's pilot: copy NLL of ``n_sets`` uniformly random head sets of every candidate ``k``.

    ``windows`` are pilot windows (the geometry's calibration documents, never the behaviour's); set ``s`` of
    size ``k`` is :func:`~qkplast.experiments.intervene.select_heads` ``by="random"`` with seed ``[seed, k, 2, s]``,
    ablated as the grid ablates. Returns ``nll`` ``[k, set]`` (mean over cells and windows), the unablated
    model's ``baseline``, ``heads`` and the attrs ``threshold``
    (:func:`~qkplast.stats.intervention_readings.working_threshold`) and ``chosen``
    (:func:`~qkplast.stats.intervention_readings.choose_k`).
    """
    def mean_nll(heads):
        cond = Intervention("pilot" if heads else "none", len(heads), heads=heads)
        with cond.context(model, metrics, ablation=ablation, reference=reference):
            return float(copy_cells(model, tokenizer, windows, design, seed, batch_size=batch_size)["nll"].mean())

    ks = sorted({min(int(k), metrics.sizes["head"]) for k in candidates})
    sets = {k: [select_heads(metrics, k, "random", seed=[seed, k, 2, s]) for s in range(n_sets)] for k in ks}
    nll = np.array([[mean_nll(h) for h in sets[k]] for k in ks])  # [k, set]
    threshold = working_threshold(int(model.config.get_text_config().vocab_size), fraction)
    out = xr.Dataset({"nll": (("k", "set"), nll),
                      "heads": (("k", "set"), np.array([[format_heads(h) for h in sets[k]] for k in ks]))},
                     coords={"k": ks, "set": np.arange(n_sets)},
                     attrs={"baseline": mean_nll([]), "threshold": threshold, "ablation": ablation,
                            "pilot_windows": len(windows)})
    out.attrs["chosen"] = choose_k(out)
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


def null_clamp_plasticity(model, tokenizer, documents, capture: xr.Dataset, metrics: xr.Dataset,
                          conds: Sequence[Intervention], *, check_docs: Sequence[str],
                          analysis: dict | None = None) -> xr.Dataset:
    """The plasticity reading's null: each null clamp set's mean ``ap_last20`` change on the held-out windows.

    Every condition of ``conds`` (the grid's "null clamp key" sets, :func:`interventions`) is re-captured on
    ``check_docs`` inside its clamp and analysed like the targeted clamp's manipulation check
    (:func:`manipulation_checks`); ``change`` ``[set]`` is
    :func:`~qkplast.stats.intervention_readings.plasticity_change` of each.
    """
    change = [plasticity_change(manipulation_checks(model, tokenizer, documents, capture, metrics, c.heads,
                                                    calibrated={"key": c.clamp}, check_docs=check_docs,
                                                    analysis=analysis)) for c in conds]
    return xr.Dataset({"change": ("set", np.asarray(change, np.float64)),
                       "heads": ("set", [format_heads(c.heads) for c in conds])},
                      coords={"set": [c.draw for c in conds]}, attrs={"documents": list(check_docs)})


def _capture_settings(capture: xr.Dataset, docs: int) -> CaptureOptions:
    """The settings ``capture`` recorded (``docs`` windows), so a re-capture differs only by the intervention."""
    attrs = capture.attrs
    return CaptureOptions(seq_len=int(attrs["seq_len"]), bucket_size=int(attrs["bucket_size"]),
                          samples_per_bucket=float(attrs["samples_per_bucket"]),
                          min_per_bucket=int(attrs["min_per_bucket"]), heads=attrs.get("heads"),
                          seed=int(attrs["seed"]), docs=docs, short_docs=attrs["short_docs"])


CALIBRATED = ("axis_a", "alpha_k", "mu_q_a", "bias_strength", "key_drift")


def clamp_label(cond: Intervention) -> tuple:
    """The key of a clamp condition's calibration: ``(mode, k)`` for a targeted clamp, ``("null key", k, draw)``
    for a null clamp set."""
    return (cond.mode, cond.k) if cond.draw < 0 else (f"null {cond.mode}", cond.k, cond.draw)


def calibrate_clamps(model, tokenizer, documents, capture: xr.Dataset, metrics: xr.Dataset, *, ks: Sequence[int],
                     calibration_docs: Sequence[str], seed: int = 0, n_null: int = 0) -> dict:
    """Every clamp condition of the grid calibrated (:func:`qkplast.experiments.calibrate.calibrate_clamp`) on the
    windows of ``calibration_docs`` (documents of ``capture``), at the capture's own sampled positions: one
    forward pass per condition, each clamped layer measured with the clamped layers below it clamped. With
    ``n_null``, the ``n_null`` null key clamps of :func:`interventions` too, each on its own heads, so that the
    null is the targeted edit made the same way on other heads.

    Returns ``{clamp_label(condition): calibrated metrics}`` (:func:`clamp_label`).
    """
    options = _capture_settings(capture, len(calibration_docs))
    chosen = [doc for doc in documents if doc.id in set(calibration_docs)]
    ids, mask = capture_windows(tokenizer, chosen, options)
    return {clamp_label(c): calibrate_clamp(model, metrics, c.heads, ids, mode=c.mode, positions=mask)
            for c in interventions(metrics, ks, n_null, seed) if c.mode}


#: Version of the products this module caches in a run directory (grid, calibration, manipulation checks,
#: geometry capture): bump it when one of them changes, so a run recomputes it instead of reusing a stale one.
SCHEMA_VERSION = 4


def _metrics_key(metrics: xr.Dataset) -> dict:
    cap = metrics.attrs.get("capture", {})
    return {"model": cap.get("model"), "model_info": cap.get("model_info"), "seq_len": cap.get("seq_len"),
            "n_docs": cap.get("n_docs"), "seed": cap.get("seed"), "options": metrics.attrs.get("options")}


def _calibration_key(calibrated: dict | None):
    return None if calibrated is None else {" ".join(map(str, label)): c.attrs.get("clamp_calibration")
                                            for label, c in sorted(calibrated.items(), key=str)}


def _array_key(x) -> str | None:
    """A short content hash of an array (a mean-ablation reference) for a cache key."""
    import hashlib

    if x is None:
        return None
    return hashlib.sha1(np.ascontiguousarray(np.asarray(getattr(x, "values", x), np.float64)).tobytes()).hexdigest()[:16]


def load_or_mean_outputs(run_dir, model, windows, metrics: xr.Dataset) -> xr.DataArray:
    """:func:`~qkplast.experiments.intervene.head_mean_outputs` over ``windows`` (the mean ablation's reference),
    cached in ``run_dir``."""
    from qkplast.experiments.intervene import head_mean_outputs

    key = {"metrics": _metrics_key(metrics), "windows": [int(np.asarray(w, np.int64).sum() % (2**31)) for w in windows],
           "model": str(getattr(model.config, "_name_or_path", "")), "schema": SCHEMA_VERSION}
    ds = cached(run_dir, "interventions-mean-outputs", key,
                lambda: head_mean_outputs(model, windows).to_dataset(name="mean"))
    return ds["mean"]


def load_or_pilot(run_dir, model, tokenizer, windows, design: CopyDesign, metrics: xr.Dataset, **params) -> xr.Dataset:
    """:func:`pilot_k`, cached in ``run_dir`` like :func:`load_or_run_grid`."""
    key = {"metrics": _metrics_key(metrics), "design": design.__dict__,
           "pilot": {k: (_array_key(v) if k == "reference" else v) for k, v in params.items()},
           "windows": [int(np.asarray(w, np.int64).sum() % (2**31)) for w in windows], "schema": SCHEMA_VERSION}
    return cached(run_dir, "interventions-pilot", key,
                  lambda: pilot_k(model, tokenizer, windows, design, metrics, **params))


def load_or_null_clamp_plasticity(run_dir, model, tokenizer, documents, capture: xr.Dataset, metrics: xr.Dataset,
                                  conds: Sequence[Intervention], *, check_docs: Sequence[str],
                                  analysis: dict | None = None) -> xr.Dataset:
    """:func:`null_clamp_plasticity`, cached in ``run_dir``."""
    key = {"metrics": _metrics_key(metrics), "sets": [format_heads(c.heads) for c in conds],
           "alpha": [_array_key(c.clamp["alpha_k"]) for c in conds], "check_docs": list(check_docs),
           "analysis": analysis, "schema": SCHEMA_VERSION}
    return cached(run_dir, "interventions-null-clamp", key,
                  lambda: null_clamp_plasticity(model, tokenizer, documents, capture, metrics, conds,
                                                check_docs=check_docs, analysis=analysis))


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
    key = {"metrics": _metrics_key(metrics), "grid": {k: (v.__dict__ if isinstance(v, CopyDesign) else
                                                          _array_key(v) if k == "reference" else v)
                                                      for k, v in params.items()},
           "windows": [int(np.asarray(w, dtype=np.int64).sum() % (2**31)) for w in windows],
           "calibrated": _calibration_key(calibrated), "schema": SCHEMA_VERSION}
    return cached(run_dir, "interventions", key,
                   lambda: run_grid(model, tokenizer, windows, metrics, calibrated=calibrated, **params))


def load_or_calibrate(run_dir, model, tokenizer, documents, capture: xr.Dataset, metrics: xr.Dataset, *,
                      ks: Sequence[int], calibration_docs: Sequence[str], seed: int = 0, n_null: int = 0) -> dict:
    """:func:`calibrate_clamps`, cached in ``run_dir``: the calibrated variables of every clamp in one file."""
    key = {"metrics": _metrics_key(metrics), "calibration": {"ks": list(ks), "docs": list(calibration_docs), "seed": seed,
                                                             "n_null": int(n_null)}, "schema": SCHEMA_VERSION}

    def compute():
        cal = calibrate_clamps(model, tokenizer, documents, capture, metrics, ks=ks, calibration_docs=calibration_docs,
                               seed=seed, n_null=n_null)
        labels = list(cal)
        return xr.Dataset(
            {name: (("clamp", *metrics[name].dims) if name in metrics else ("clamp", "head", "dim"),
                    np.stack([cal[c][name].values for c in labels])) for name in CALIBRATED},
            coords={"clamp_mode": ("clamp", [c[0] for c in labels]), "clamp_k": ("clamp", [c[1] for c in labels]),
                    "clamp_draw": ("clamp", [c[2] if len(c) > 2 else -1 for c in labels])},
            attrs={"calibration": [cal[c].attrs["clamp_calibration"] for c in labels]})

    ds = cached(run_dir, "clamp-calibration", key, compute)
    out = {}
    for i, (mode, k, draw) in enumerate(zip(ds.clamp_mode.values, ds.clamp_k.values, ds.clamp_draw.values)):
        one = metrics.copy()
        for name in CALIBRATED:
            one[name] = (ds[name].dims[1:], ds[name].values[i])
        one.attrs = dict(metrics.attrs, clamp_calibration=ds.attrs["calibration"][i])
        out[(str(mode), int(k)) if int(draw) < 0 else (str(mode), int(k), int(draw))] = one
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
