"""Figures of the miniature's training (chapter 10): loss curves, loss by position, and the trajectory of the
checkpoints beside the thesis's SmolLM3 checkpoints (Table 6.2) on the same axes, the share of each stage."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from qkplast.stats.intervals import t_interval
from qkplast.train.evaluate import position_bins

__all__ = ["ARM_STYLE", "at_window", "loss_by_position", "loss_curves", "seed_means", "thesis_stage_shares", "trajectory_beside_thesis"]

#: Colour and label of each run of the miniature.
ARM_STYLE = {"stageA": ("black", "stage A"), "rescaled": ("tab:red", "rescaled (base x10, window x4)"),
             "control": ("tab:blue", "control (base kept, window x4)"),
             "rescaled-short": ("tab:green", "rescaled-short (base x10, window kept)")}


def _fig(nrows=1, ncols=1, width=6.4, height=4.0):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    fig.set_layout_engine("constrained")
    return fig, axes


def _smooth(values: np.ndarray, width: int) -> np.ndarray:
    width = max(1, min(width, len(values)))
    return np.convolve(values, np.ones(width) / width, mode="valid")


def loss_curves(training: dict, config, entropies: dict, smooth: int = 10):
    """Training loss (mean over seeds, running mean over ``smooth`` steps) against the unigram and bigram entropies.

    The extension arms continue the stage-A axis from the checkpoint they start from: their step ``n`` is plotted
    at ``ext_start + n`` (the end of stage A, or the start of its decay when the arms branch before it).
    """
    fig, ((ax,),) = _fig(width=7.2)
    for arm in ("stageA", *config.arms):
        runs = [r for r in training["runs"] if r["arm"] == arm]
        steps = np.array([s["step"] for s in runs[0]["steps"]]) + (0 if arm == "stageA" else config.ext_start)
        loss = np.mean([[s["loss"] for s in r["steps"]] for r in runs], 0)  # [step], mean over seeds
        color, label = ARM_STYLE[arm]
        ax.plot(steps[smooth - 1:] if len(steps) >= smooth else steps[-1:], _smooth(loss, smooth), color=color,
                label=label)
    for name, style in (("unigram", ":"), ("bigram", "--")):
        ax.axhline(entropies[name], color="grey", ls=style, label=f"{name} entropy (held out)")
    ax.axvline(config.ext_start, color="grey", lw=0.5)
    ax.set(xlabel="optimiser step (extension arms from their branch of stage A)", ylabel="training loss (nats / token)",
           title=f"loss, mean over {config.seeds} seeds (running mean of {smooth} steps)")
    ax.legend(fontsize=8)
    return fig


def seed_means(table: pd.DataFrame, column: str) -> pd.DataFrame:
    """Mean of ``column`` over seeds with its t interval, per (arm, window_kind, step, fraction)."""
    rows = []
    for key, group in table.groupby(["arm", "window_kind", "step", "fraction"], sort=True):
        t = t_interval(group[column].values)
        rows.append({**dict(zip(["arm", "window_kind", "step", "fraction"], key)), "mean": float(t["estimate"]),
                     "lo": float(t["lo"]), "hi": float(t["hi"])})
    return pd.DataFrame(rows)


def at_window(table: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Rows measured at ``kind``: ``"own"`` (the window the checkpoint was trained at), ``"ext"`` (the extension
    window) or a window kind of the table itself (``"L"``, ``"4L"``)."""
    if kind == "own":
        return table[table.window == table.train_window]
    if kind == "ext":
        return table[table.window == table.window.max()]
    return table[table.window_kind == kind]


def loss_by_position(table: pd.DataFrame, config):
    """Held-out loss by position at the final checkpoint of each run (mean over seeds): falling along the window
    means the model uses its context; the stage-A model read past its window shows what the extension repairs."""
    fig, ((ax,),) = _fig(width=7.2)
    finals = [("stageA", "own", "-"), ("stageA", "ext", ":")] + [(arm, "own", "-") for arm in config.arms]
    for arm, kind, style in finals:
        sub = at_window(table[table.arm == arm], kind)
        sub = sub[sub.step == sub.step.max()]
        profile = np.mean(np.stack(sub.loss_by_position.values), 0)  # [bin], bins of position_bins(window)
        window = int(sub.window.iloc[0])
        edges = np.array(position_bins(window), float)
        centres = np.sqrt(edges[:-1] * (edges[1:] - 1).clip(min=edges[:-1]))  # geometric middle of each bin
        color, label = ARM_STYLE[arm]
        suffix = f" at {window} tokens" + (" (past its training window)" if kind == "ext" else "")
        ax.plot(centres, profile, style, color=color, label=f"{label}, end{suffix}")
    ax.set_xscale("log")
    ax.axvline(config.window, color="grey", lw=0.5)
    ax.set(xlabel="position in the window (tokens of context before the predicted one)",
           ylabel="held-out loss (nats / token)",
           title=f"loss by position at the last checkpoints, mean over {config.seeds} seeds")
    ax.legend(fontsize=8)
    return fig


def thesis_stage_shares(thesis: pd.DataFrame) -> pd.Series:
    """Share of its stage of each SmolLM3 checkpoint of Table 6.2: pre-training steps over the last pre-training
    checkpoint (4.72M), extension steps over the phase's 20K steps (section 5.2.2)."""
    def steps(name: str) -> float:
        number, unit = re.search(r"_([\d.]+)([km])$", name).groups()
        return float(number) * (1e3 if unit == "k" else 1e6)

    raw = thesis.checkpoint.map(steps)
    pre = ~thesis.checkpoint.str.startswith("lc")
    return pd.Series(np.where(pre, raw / raw[pre].max(), raw / 20e3), index=thesis.index)


def trajectory_beside_thesis(table: pd.DataFrame, thesis: pd.DataFrame, config):
    """Bias (relative to the end of stage A), AP_first20 and AP_drop along each stage: the miniature's arms (mean
    over seeds, 95% t band) and SmolLM3's checkpoints (thesis Table 6.2), x = share of the stage.

    ``thesis`` is :func:`qkplast.results.reference.load` ``("smollm3_trajectory")``. Stage-A step 0 is left out of
    the log axis.
    """
    fig, axes = _fig(3, 2, width=5.0, height=3.0)
    own = at_window(table, "own").assign(window_kind="own")
    end = own[(own.arm == "stageA") & (own.fraction == 1.0)].set_index("seed")
    relative = own.assign(abs_bias_strength=own.abs_bias_strength / own.seed.map(end.abs_bias_strength))
    shares = thesis_stage_shares(thesis)
    thesis = thesis.assign(share=shares, bias_rel=thesis.bias_strength / thesis.bias_strength[shares.index[
        ~thesis.checkpoint.str.startswith("lc")]].iloc[-1])
    metrics = [("abs_bias_strength", "bias_rel", "|bias| / end of stage A"), ("ap_first20", "ap_first20", "AP_first20"),
               ("ap_drop", "ap_drop", "AP_drop")]
    for row, (ours, theirs, label) in enumerate(metrics):
        means = seed_means(relative, ours)
        for col, arms in enumerate((["stageA"], list(config.arms))):
            ax = axes[row, col]
            for arm in arms:
                m = means[(means.arm == arm) & (means.window_kind == "own") & (means.fraction > 0)]
                color, name = ARM_STYLE[arm]
                ax.plot(m.fraction, m["mean"], "-o", color=color, ms=3, label=f"miniature {name}")
                ax.fill_between(m.fraction, m.lo, m.hi, color=color, alpha=0.15)
            phases = thesis[~thesis.checkpoint.str.startswith("lc")] if col == 0 else thesis[
                thesis.checkpoint.str.startswith("lc")]
            for phase, part in phases.groupby("phase", sort=False):
                marker = "v" if phase.startswith("LC 32K") or phase == "Anneal" else "^"
                ax.plot(part.share, part[theirs], "k" + marker, ms=6, mfc="none", label=f"SmolLM3 {phase}")
            ax.set_xscale("log")
            ax.set(ylabel=label)
            if row == 0:
                ax.set_title("stage A (pre-training)" if col == 0 else "stage B (extension)")
            if row == 2:
                ax.set_xlabel("share of the stage (step / stage length)")
    axes[0, 0].legend(fontsize=7)
    axes[0, 1].legend(fontsize=7)
    fig.suptitle(f"the miniature ({config.seeds} seeds) beside SmolLM3-3B (thesis Table 6.2)")
    return fig
