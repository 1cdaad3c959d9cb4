"""Results across the runs of a study: the cross-model tables and figures of chapter 6.

The results notebooks take a ``study`` parameter (a study file or directory); with one, their
study cells call these functions, which read every run's ``metrics.nc`` in study order and set the
runs beside the thesis's rows: Table 6.1 (plasticity by fifth of the context), the profiles figure,
Fig. 6.7 (AP_drop against LongBench-Pro, for runs of a model the thesis scored) and, when the study is
a checkpoint series, the Table 6.2 trajectory. :func:`compare_tables` gives the same tables for
``qkplast compare``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from qkplast.results import reference
from qkplast.results import tables as results
from qkplast.results.summary import compare, context_profiles
from qkplast.rundir.products import open_metrics
from qkplast.rundir.study_file import Study, load_study
from qkplast.stats.bootstrap import head_bootstrap


def as_study(study: str | os.PathLike | Study) -> Study:
    return study if isinstance(study, Study) else load_study(study)


def study_metrics(study: str | os.PathLike | Study) -> dict[str, xr.Dataset]:
    """``{run name: metrics}`` for every run of the study that has its analysis, in study order.

    Runs without ``metrics.nc`` yet are left out and listed in ``attrs``-like ``missing`` of the result's
    caller via :func:`missing_runs`.
    """
    study = as_study(study)
    return {r.name: open_metrics(r.run_dir) for r in study.runs if (r.run_dir / "metrics.nc").exists()}


def missing_runs(study: str | os.PathLike | Study) -> list[str]:
    study = as_study(study)
    return [r.name for r in study.runs if not (r.run_dir / "metrics.nc").exists()]


def table_6_1(study: str | os.PathLike | Study, include_thesis: bool = True) -> pd.DataFrame:
    """Table 6.1's layout with one row per run (study order) above the thesis's rows.

    The extra column is the 95% percentile interval of the run's AP_drop over heads (1000 replicates).
    """
    metrics = study_metrics(study)
    if not metrics:
        raise ValueError(f"no run of study {as_study(study).name!r} has been analysed yet; run qkplast study first")
    table = results.quintile_table(metrics, include_thesis=include_thesis)
    col = "AP_drop 95% interval (heads)"
    table[col] = ""
    for group, model in table.index:
        if model in metrics and not group.startswith("thesis"):
            lo, hi = head_bootstrap(metrics[model].ap_drop.values)
            table.loc[(group, model), col] = f"[{lo:.3f}, {hi:.3f}]"
    return table


def geometry_across(study: str | os.PathLike | Study) -> pd.DataFrame:
    """Section 6.1's quantities (rows) for the thesis and each run of the study (columns, study order)."""
    metrics = study_metrics(study)
    if not metrics:
        raise ValueError(f"no run of study {as_study(study).name!r} has been analysed yet; run qkplast study first")
    tables = {name: results.geometry_table(m) for name, m in metrics.items()}
    first = next(iter(tables.values()))
    return pd.concat([first[["thesis"]], *[t[["this run"]].rename(columns={"this run": n}) for n, t in tables.items()]],
                     axis=1)


def profiles(study: str | os.PathLike | Study) -> xr.DataArray:
    """Mean plasticity over the context fraction bins per run (dims ``run, context_bin``), study order."""
    return context_profiles(study_metrics(study))


def profiles_figure(study: str | os.PathLike | Study):
    """Table 6.1's profiles: the thesis's models thin (by family), each run of the study bold in its own colour."""
    import matplotlib.pyplot as plt

    table = table_6_1(study)
    fig, ax = plt.subplots(figsize=(7.4, 4.6), layout="constrained")
    x = np.arange(5)
    family = {"Ministral-3": "tab:green", "Qwen-3": "tab:purple", "Llama-3.2": "tab:orange"}
    ours = [(g, m) for g, m in table.index if not g.startswith("thesis")]
    for (group, model), row in table.iterrows():
        if group.startswith("thesis"):
            name = group.removeprefix("thesis: ")
            first = model == table.loc[group].index[0]
            ax.plot(x, row.iloc[:5].to_numpy(float), "-", lw=1, alpha=0.5, color=family.get(name, "0.6"),
                    label=f"thesis: {name}" if first else None)
    colors = plt.get_cmap("tab10" if len(ours) <= 10 else "tab20")
    for i, (group, model) in enumerate(ours):
        corpus = group.removeprefix("this project (").rstrip(")")
        ax.plot(x, table.loc[(group, model)].iloc[:5].to_numpy(float), "-", lw=2.5, color=colors(i % colors.N),
                marker="osD^v<>ph*"[i % 10], label=f"{model} ({corpus})")
    ax.set_xticks(x, list(table.columns[:5]))
    ax.set(xlabel="query position (share of the context window)", ylabel="mean attention plasticity",
           title=f"study {as_study(study).name}: plasticity by fifth of the context (Table 6.1 layout)")
    ax.legend(fontsize=7, ncol=2)
    return fig


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def thesis_model(run_name: str, model_id: str) -> str | None:
    """The thesis model (models.csv) a run is of: by run name, else by the hub id's name part."""
    names = reference.load("models").model.tolist()
    by_norm = {_norm(n): n for n in names}
    if _norm(run_name) in by_norm:
        return by_norm[_norm(run_name)]
    repo = _norm(model_id.split("@")[0].split("/")[-1])
    # hub names spell the family without the thesis's dash (Qwen3 vs Qwen-3) and may add -Base-2512
    return next((n for k, n in sorted(by_norm.items(), key=lambda kv: -len(kv[0])) if repo.startswith(k)), None)


def benchmark_matches(study: str | os.PathLike | Study) -> pd.DataFrame:
    """Runs of a thesis model with a LongBench-Pro score: their AP_drop beside the thesis's (Table 6.3)."""
    study = as_study(study)
    metrics = study_metrics(study)
    lb = reference.load("longbench_matched").set_index("model")
    rows = []
    for r in study.runs:
        thesis = thesis_model(r.name, r.id)
        if r.name in metrics and thesis in lb.index:
            drop = metrics[r.name].ap_drop.values
            lo, hi = head_bootstrap(drop)
            rows.append({"run": r.name, "thesis model": thesis, "LongBench-Pro": lb.loc[thesis, "lbp_score"],
                         "thesis AP_drop": lb.loc[thesis, "ap_drop"], "run AP_drop": float(np.nanmean(drop)),
                         "run AP_drop 95% interval (heads)": f"[{lo:.3f}, {hi:.3f}]"})
    return pd.DataFrame(rows, columns=["run", "thesis model", "LongBench-Pro", "thesis AP_drop", "run AP_drop",
                                       "run AP_drop 95% interval (heads)"]).set_index("run")


def benchmark_figure(study: str | os.PathLike | Study):
    """Fig. 6.7 with the thesis's seven models and, beside each matched run, the run's AP_drop at its model's score."""
    import qkplast.results.figures as qp

    matches = benchmark_matches(study)
    fig = qp.benchmark_scatter(reference.load("longbench_matched"))
    ax = fig.axes[0]
    if len(matches):
        ax.scatter(matches["run AP_drop"], matches["LongBench-Pro"], marker="x", s=70, color="k", label="this study's runs")
        for run, row in matches.iterrows():
            ax.annotate(run, (row["run AP_drop"], row["LongBench-Pro"]), fontsize=7, xytext=(3, -9),
                        textcoords="offset points")
        ax.legend(fontsize=8)
    return fig


def is_checkpoint_series(study: str | os.PathLike | Study) -> bool:
    """Whether every run is a revision of one and the same model (a training trajectory)."""
    study = as_study(study)
    models = {r.capture.model for r in study.runs}
    revisions = [r.capture.revision for r in study.runs]
    return len(study.runs) > 1 and len(models) == 1 and all(revisions) and len(set(revisions)) == len(revisions)


def trajectory(study: str | os.PathLike | Study) -> pd.DataFrame:
    """Table 6.2's columns for the study's checkpoints in study order, with the thesis's row of the same index."""
    study = as_study(study)
    metrics = study_metrics(study)
    ours = results.trajectory_table(metrics)
    thesis = results.thesis_trajectory().reset_index()
    ckpts = reference.load("smollm3_checkpoints").checkpoint.tolist()
    ours["thesis row"] = [thesis.label[ckpts.index(n)] if n in ckpts else "" for n in ours.index]
    return ours


def compare_tables(study: str | os.PathLike | Study) -> dict[str, pd.DataFrame]:
    """Every cross-run table of the study, by file stem (what ``qkplast compare`` writes as CSV)."""
    study = as_study(study)
    dirs = [r.run_dir for r in study.runs if (r.run_dir / "metrics.nc").exists()]
    tables = {"summary": compare(dirs), "geometry": geometry_across(study), "table_6_1": table_6_1(study),
              "benchmark": benchmark_matches(study)}
    if is_checkpoint_series(study):
        tables["trajectory"] = trajectory(study)
    return tables


def write_compare(study: str | os.PathLike | Study, out: str | os.PathLike) -> list[Path]:
    """Write :func:`compare_tables` as ``OUT/<stem>.csv``; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, table in compare_tables(study).items():
        paths.append(out / f"{stem}.csv")
        table.to_csv(paths[-1])
    return paths


__all__ = ["benchmark_figure", "benchmark_matches", "compare_tables", "geometry_across", "profiles_figure",
           "is_checkpoint_series", "missing_runs", "profiles", "study_metrics", "table_6_1",
           "thesis_model", "trajectory", "write_compare"]
