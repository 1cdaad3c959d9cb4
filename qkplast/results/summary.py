"""Model-level summaries of runs: the headline metrics of chapter 6, one row per run (``qkplast compare``)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import xarray as xr

from qkplast.rundir.products import RunError, open_metrics
from qkplast.rundir.study_file import STUDY_JSON, load_study

__all__ = ["SUMMARY", "compare", "context_profiles", "expand_runs", "summarize"]

#: headline metric -> its model-level value (a mean over heads unless said)
SUMMARY = {
    "heads": lambda m: m.sizes["head"],
    "evr_pc0": lambda m: float(m.explained_variance_ratio[:, 0].mean()),
    "abs_r_q_pc0": lambda m: float(abs(m.r_q_pc[:, 0]).mean()),
    "abs_r_k_pc0": lambda m: float(abs(m.r_k_pc[:, 0]).mean()),
    "abs_r_q_a": lambda m: float(abs(m.r_q_a).mean()),
    "abs_r_k_a": lambda m: float(abs(m.r_k_a).mean()),
    "share_bias_positive": lambda m: float((m.bias_strength > 0).mean()),
    "mean_bias_strength": lambda m: float(m.bias_strength.mean()),
    "plane_variance_fraction": lambda m: float(m.plane_variance_fraction.mean()),
    "ap_overall": lambda m: float(m.ap_overall.mean()),
    "ap_first20": lambda m: float(m.ap_first20.mean()),
    "ap_last20": lambda m: float(m.ap_last20.mean()),
    "ap_drop": lambda m: float(m.ap_drop.mean()),
}


def summarize(metrics: xr.Dataset) -> dict:
    """Model-level means of the headline metrics (the quantities of chapter 6) and the taxonomy shares."""
    out = {name: fn(metrics) for name, fn in SUMMARY.items()}
    tax = pd.Series(metrics.taxonomy.values).value_counts(normalize=True)
    for name in ("position-dominated", "q-positional", "content-focused", "mixed"):
        out[f"share_{name}"] = float(tax.get(name, 0.0))
    return out


def expand_runs(paths) -> list[Path]:
    """Run directories of the arguments of ``qkplast compare``: a study file or study directory stands for
    its analysed runs in study order; any other path is a run directory."""
    out = []
    for p in map(Path, paths):
        if p.suffix in (".yaml", ".yml") or (p / STUDY_JSON).exists():
            out += [r.run_dir for r in load_study(p).runs if (r.run_dir / "metrics.nc").exists()]
        else:
            out.append(p)
    return out


def compare(run_dirs: list[str | os.PathLike]) -> pd.DataFrame:
    """One row per run directory (or per analysed run of a study): model, corpus, context and the headline metrics."""
    rows = []
    for d in expand_runs(run_dirs):
        metrics = open_metrics(d)
        cap_attrs = metrics.attrs.get("capture", {})
        rows.append({"run": Path(d).name, "model": cap_attrs.get("model"), "corpus": cap_attrs.get("corpus"),
                     "seq_len": cap_attrs.get("seq_len"), **summarize(metrics)})
    if not rows:
        raise RunError("compare needs at least one run directory")
    return pd.DataFrame(rows).set_index("run")


def context_profiles(metrics_by_run: dict[str, xr.Dataset]) -> xr.DataArray:
    """Mean plasticity over the context fraction bins per run (dims ``run, context_bin``), in the dict's order."""
    return xr.concat([m.ap_context.mean("head").expand_dims(run=[name]) for name, m in metrics_by_run.items()], "run")
