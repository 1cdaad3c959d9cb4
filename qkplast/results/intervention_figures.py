"""Figures of the intervention grid (chapter "Beyond the thesis: interventions"): the copy NLL by cell under each
targeted condition, the targeted ablations among their matched null sets, and the effects with their intervals.

The grid comes from :func:`qkplast.experiments.head_interventions.run_grid`, the null positions from
:func:`qkplast.stats.intervention_readings.null_position` and the effect table from
:func:`qkplast.stats.intervention_readings.effect_table`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from qkplast.stats.intervention_readings import null_position

__all__ = ["STYLE", "plot_cells", "plot_effects", "plot_null"]


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
