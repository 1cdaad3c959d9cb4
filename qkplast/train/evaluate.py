"""Every checkpoint of a training measured: loss by position, the attention sink, and the Q/K geometry.

For each checkpoint (seed, arm, step) and each window it is measured at (its own training window; a stage-A
checkpoint also at the extension window), :func:`measure_checkpoint`

* runs the model (eager attention) on held-out evaluation windows (the held-out documents packed and cut, so a
  position in the window is not a position in a document): the cross-entropy at every position (does the model
  use its context: late positions below early ones?) and the attention mass the queries put on the first token
  (the sink), averaged over layers, heads and query positions ``t >= 1``;
* captures the post-RoPE queries and keys of every head on held-out documents
  (:func:`qkplast.capture.driver.capture`, the model loaded by :func:`qkplast.capture.models.load_model`) and
  analyses them (:func:`qkplast.analyze`), keeping the means over heads of the thesis's quantities.

:func:`checkpoint_table` gathers one row per (checkpoint, window), cached in ``DIR/geometry/`` by commit, window
and settings. :func:`seed_readings` turns pre-registered contrasts into intervals over seeds and verdicts.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from qkplast.analysis.metrics import SCHEMA_VERSION
from qkplast.options import AnalysisOptions, CaptureOptions
from qkplast.train.config import TrainConfig
from qkplast.train.data import load_data
from qkplast.train.hub import branches, hub_cache, repo_id, snapshot
from qkplast.train.model import quiet_loading

__all__ = ["MeasureSettings", "READING_COLUMNS", "checkpoint_rows", "checkpoint_table", "locate", "measure_checkpoint",
           "position_bins", "position_profile", "seed_readings"]

#: Per-head quantities kept as their mean over heads (columns of :func:`checkpoint_table`).
HEAD_MEANS = {
    "bias_strength": lambda m: m.bias_strength,
    "abs_bias_strength": lambda m: abs(m.bias_strength),
    "key_position_slope": lambda m: m.key_position_slope,
    "abs_alpha_k": lambda m: abs(m.alpha_k),
    "abs_r_k_a": lambda m: abs(m.r_k_a),
    "abs_r_q_0": lambda m: abs(m.r_q_pc.isel(pc=0)),
    "abs_r_k_0": lambda m: abs(m.r_k_pc.isel(pc=0)),
    "ap_overall": lambda m: m.ap_overall,
    "ap_first20": lambda m: m.ap_first20,
    "ap_last20": lambda m: m.ap_last20,
    "ap_drop": lambda m: m.ap_drop,
    "ap_drop_baseline": lambda m: m.ap_drop_baseline,
    "ap_drop_bias": lambda m: m.ap_drop_bias,
    "ap_drop_content": lambda m: m.ap_drop_content,
    "ap_drop_interaction": lambda m: m.ap_drop_interaction,
}


@dataclass(frozen=True)
class MeasureSettings:
    """How each checkpoint is measured.

    docs : int
        Held-out documents captured per checkpoint (4).
    samples_per_bucket : float
        Expected captured positions per bucket and document (8; 16 buckets per window: 32 queries a bucket).
    eval_windows : int
        Held-out evaluation windows of the loss by position (16).
    sink_windows : int
        The first of them that give the attention mass on token 0 (4; an eager pass, which keeps every
        attention weight, so it is the costly part).
    """

    docs: int = 4
    samples_per_bucket: float = 8.0
    eval_windows: int = 16
    sink_windows: int = 4

    def capture_options(self, out, model: str, window: int) -> CaptureOptions:
        bucket = window // 16
        return CaptureOptions(model=model, corpus=str(Path(out) / "data" / "heldout.jsonl"), docs=self.docs,
                              seq_len=window, bucket_size=bucket, samples_per_bucket=min(self.samples_per_bucket, bucket),
                              heads=None, short_docs="skip", device="cpu", dtype="float32", seed=0)


def checkpoint_rows(config: TrainConfig, training: dict) -> pd.DataFrame:
    """One row per (checkpoint, window measured): seed, arm, branch, step, fraction of its stage, window, theta.

    ``window_kind`` is ``own`` (the window the checkpoint was trained at) or ``ext`` (a stage-A checkpoint at the
    extension window).
    """
    rows = []
    for run in training["runs"]:
        arm, total = run["arm"], config.steps_of(run["arm"])
        for branch, step in run["branches"].items():
            kinds = [("own", config.window_of(arm))] + ([("ext", config.ext_window)] if arm == "stageA" else [])
            for kind, window in kinds:
                rows.append({"seed": run["seed"], "arm": arm, "branch": branch, "step": step, "fraction": step / total,
                             "window_kind": kind, "window": window, "rope_theta": run["rope_theta"]})
    return pd.DataFrame(rows)


def position_profile(model, windows: np.ndarray, sink_windows: int | None = None) -> tuple[np.ndarray, float]:
    """Cross-entropy at each position ``[L - 1]`` (mean over windows) and the mean attention mass on token 0.

    The loss comes from the model's own kernel on every window; the sink mass from an eager pass (which returns
    the attention weights) over the first ``sink_windows`` windows (None: all), averaging
    ``A[layer, head, t, 0]`` over layers, heads and query positions ``t >= 1`` (position 0 attends only to
    itself). The eager pass holds every layer's ``[head, L, L]`` weights, so it is kept to a few windows.
    """
    import torch

    ids = torch.from_numpy(np.array(windows, np.int64))  # [window, L]; a copy: the windows may be a read-only map
    losses = []
    with torch.no_grad():
        for x in ids.split(4):  # x: [4, L], four windows a forward
            logp = torch.log_softmax(model(input_ids=x).logits[:, :-1].double(), -1)  # [4, L-1, V]
            losses.append(-logp.gather(2, x[:, 1:, None]).squeeze(2).numpy())  # [4, L-1]
        before = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            sinks = [float(torch.stack(model(input_ids=x, output_attentions=True).attentions)[:, 0, :, 1:, 0]
                           .double().mean()) for x in ids[:sink_windows, None]]  # attentions: [layer, 1, head, L, L]
        finally:
            model.set_attn_implementation(before)
    return np.concatenate(losses).mean(0), float(np.mean(sinks))


def position_bins(window: int) -> list[int]:
    """Edges of the loss-by-position bins: powers of two, ``[1, 2), [2, 4), ...``, the last ending at ``window - 1``."""
    edges = [1]
    while edges[-1] * 2 < window - 1:
        edges.append(edges[-1] * 2)
    return edges + [window - 1]


def measure_checkpoint(out, seed: int, branch: str, window: int, settings: MeasureSettings = MeasureSettings(),
                       analysis: AnalysisOptions = AnalysisOptions()) -> dict:
    """Loss by position, sink mass and head-mean geometry of checkpoint ``branch`` of ``seed`` at ``window``."""
    from qkplast.analysis.metrics import analyze
    from qkplast.capture.corpus import open_corpus
    from qkplast.capture.driver import capture
    from qkplast.capture.models import load_model

    out = Path(out)
    path = snapshot(hub_cache(out), repo_id(seed), branch)
    options = settings.capture_options(out, str(path), window)
    with quiet_loading():
        loaded = load_model(str(path), device="cpu", dtype="float32", seq_len=window, local_files_only=True)
    held = load_data(out).heldout_stream[: settings.eval_windows, :window]
    loss, sink = position_profile(loaded.model, held, settings.sink_windows)  # loss[i]: token i + 1 from tokens 0..i
    edges = position_bins(window)
    cap = capture(loaded.model, loaded.tokenizer, open_corpus(options.corpus), None, options, progress=False,
                  model_info=loaded.info)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # buckets without pairs give NaN with a warning; the means skip them
        metrics = analyze(cap, analysis)
    row = {name: float(np.nanmean(fn(metrics).values)) for name, fn in HEAD_MEANS.items()}
    row.update(share_position_dominated=float(np.mean(metrics.taxonomy.values == "position-dominated")),
               sink_mass=sink, loss=float(loss.mean()), loss_early=float(loss[:7].mean()),
               loss_late=float(loss[(window - 1) // 2:].mean()),
               loss_by_position=[float(loss[a - 1:b - 1].mean()) for a, b in zip(edges[:-1], edges[1:])],
               heads=int(metrics.sizes["head"]), commit=loaded.info.get("commit"))
    return row


def checkpoint_table(out, config: TrainConfig, training: dict, settings: MeasureSettings = MeasureSettings(),
                     analysis: AnalysisOptions = AnalysisOptions(), progress: bool = True) -> pd.DataFrame:
    """:func:`measure_checkpoint` for every row of :func:`checkpoint_rows`, cached in ``out/geometry/``.

    A cached measurement is reused when its commit, window and settings match; identical checkpoints (the
    control arm's step 0 is the final stage-A checkpoint) are measured once.
    """
    from tqdm.auto import tqdm

    out = Path(out)
    rows = checkpoint_rows(config, training)
    measured = []
    for r in tqdm(rows.itertuples(), total=len(rows), desc="checkpoints", disable=not progress, mininterval=20):
        commit = branches(hub_cache(out), repo_id(r.seed))[r.branch]
        key = {"commit": commit, "window": int(r.window), "settings": settings.__dict__,
               "analysis": analysis.result_key(), "metrics_schema": SCHEMA_VERSION}  # a stale row is measured again
        cache = out / "geometry" / f"{commit}-w{r.window}.json"
        cached = json.loads(cache.read_text()) if cache.exists() else None
        if cached is None or cached["key"] != key:
            cached = {"key": key, "row": measure_checkpoint(out, r.seed, r.branch, int(r.window), settings, analysis)}
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(cached))
        measured.append(cached["row"])
    return pd.concat([rows, pd.DataFrame(measured)], axis=1)


def locate(table: pd.DataFrame, arm: str, fraction: float, window_kind: str = "own") -> pd.DataFrame:
    """Rows of ``arm`` at the checkpoint whose share of its stage is nearest ``fraction``, one per seed."""
    sub = table[(table.arm == arm) & (table.window_kind == window_kind)]
    if sub.empty:
        raise KeyError(f"no checkpoint of arm {arm!r} measured at its {window_kind!r} window")
    nearest = sub.fraction.iloc[np.argmin(np.abs(sub.fraction.values - fraction))]
    return sub[sub.fraction == nearest].set_index("seed").sort_index()


#: Columns of :func:`seed_readings`.
READING_COLUMNS = ["metric", "from", "to", "claim", "margin", "estimate", "lo", "hi", "p", "p_holm", "seeds", "verdict"]


def seed_readings(table: pd.DataFrame, readings: dict, level: float = 0.95) -> pd.DataFrame:
    """The pre-registered readings decided from the seeds.

    Each reading is ``{"metric", "from": (arm, fraction, window_kind), "to": (...), "claim", "margin"}``: the
    contrast is ``metric`` at ``to`` minus at ``from``, one value per seed; Student's t interval over the seeds
    (:func:`qkplast.stats.intervals.t_interval`) and its p-value, Holm's correction across the directional
    readings (:func:`qkplast.stats.decision.holm`), and the verdict word (:func:`qkplast.stats.decision.verdict`;
    an equivalence reading is decided by its interval against its margin). A reading with ``"claim": None`` is
    exploratory: its interval is shown, no verdict is given and it does not enter the correction.
    """
    from qkplast.stats.intervals import t_interval
    from qkplast.stats.decision import holm, verdict

    rows = []
    for name, r in readings.items():
        a, b = locate(table, *r["from"]), locate(table, *r["to"])
        contrast = (b[r["metric"]] - a[r["metric"]]).dropna()  # [seed]
        t = t_interval(contrast.values, level=level)
        rows.append({"reading": name, "metric": r["metric"], "from": "{}@{:.0%} ({})".format(*r["from"]),
                     "to": "{}@{:.0%} ({})".format(*r["to"]), "claim": r.get("claim"), "margin": r.get("margin"),
                     "estimate": float(t["estimate"]), "lo": float(t["lo"]), "hi": float(t["hi"]),
                     "p": float(t["p"]), "seeds": int(t["n"])})
    directional = [i for i, r in enumerate(rows) if r["claim"] in ("greater", "less")]
    adjusted = holm([rows[i]["p"] for i in directional])
    for i, row in enumerate(rows):
        row["p_holm"] = float(adjusted[directional.index(i)]) if i in directional else np.nan
        claim, margin = row["claim"], row["margin"]
        row["verdict"] = "" if claim is None else verdict(
            row["estimate"], row["lo"], row["hi"], None if claim == "equivalent" else row["p_holm"], claim=claim,
            margin=margin)
    out = pd.DataFrame(rows).set_index("reading")
    return out[READING_COLUMNS]
