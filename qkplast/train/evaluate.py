"""Every checkpoint of a training measured: loss by position, the attention sink, and the Q/K geometry.

Every checkpoint (seed, arm, step), whatever its arm, is measured at two windows: ``L``, stage A's window, and
the extension window (``4L`` with the default ``ext_factor``), so that each prediction compares values read at the
same window (a contrast across windows is not a reading: bias strength is a slope per token). One model load per
checkpoint and window gives, in :func:`measure_checkpoint`, every learned gate's input (:mod:`qkplast.train.gates`)
and the geometry:

* runs the model on held-out evaluation windows (the held-out documents packed and cut, so a position in the
  window is not a position in a document): the cross-entropy at every position (does the model use its context:
  late positions below early ones?) and the attention mass the queries put on the first token (the sink, from an
  eager pass), averaged over layers, heads and query positions ``t >= 1``;
* the copy score: the loss on held-out windows carrying a span of random tokens repeated at a random distance
  (:func:`qkplast.train.gates.copy_score`);
* captures the post-RoPE queries and keys of every head on held-out documents
  (:func:`qkplast.capture.driver.capture`, the model loaded by :func:`qkplast.capture.models.load_model`) and
  analyses them (:func:`qkplast.analyze`), keeping the means over heads of the thesis's quantities.

:func:`checkpoint_table` gathers one row per (checkpoint, window), cached in ``DIR/geometry/`` by commit, window
and settings, measured in worker processes if asked (a killed table resumes from its cache).
:func:`seed_readings` turns pre-registered contrasts into intervals over seeds and verdicts, "not testable" on
checkpoints that failed a gate, with the smallest effect the seeds detect beside each.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from qkplast.analysis.schema import SCHEMA_VERSION
from qkplast.errors import QkplastError
from qkplast.options import AnalysisOptions, CaptureOptions
from qkplast.train.config import TrainConfig
from qkplast.train.data import copy_windows, load_data, with_bos
from qkplast.train.gates import copy_score, in_context_gain, position_mean, sink_ratio
from qkplast.train.hub import branches, hub_cache, repo_id, snapshot
from qkplast.train.model import quiet_loading

__all__ = ["MeasureSettings", "MeasureSettingsError", "READINGS_FILE", "READING_COLUMNS", "checkpoint_rows",
           "checkpoint_table", "decisive_steps", "load_full_run", "load_readings", "locate", "measure_checkpoint", "place_label", "position_bins", "position_profile", "position_segments",
           "save_full_run", "seed_readings", "window_kinds"]

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


class MeasureSettingsError(QkplastError):
    """A measurement setting is out of range."""


#: Settings of :class:`MeasureSettings` that cannot change a measured value beyond rounding: left out of the cache
#: key (a row measured on the GPU is reused on the CPU), recorded in each row instead.
MEASURE_EXECUTION_FIELDS = ("device",)

#: Seed of the copy windows: every checkpoint is scored on the same copies (paired across checkpoints).
COPY_SEED = 0


@dataclass(frozen=True)
class MeasureSettings:
    """How each checkpoint is measured.

    docs : int
        Held-out documents captured per checkpoint (16; documents are not the unit, seeds are: more documents
        shrink each seed's noise).
    samples_per_bucket : float
        Expected captured positions per bucket and document (8; 16 buckets per window: 128 queries a bucket).
    eval_windows : int
        Held-out evaluation windows of the loss by position (16).
    sink_windows : int
        The first of them that give the attention mass on token 0 (4; an eager pass, which keeps every
        attention weight, so it is the costly part).
    copy_windows : int
        Held-out windows carrying a repeated span of random tokens, for the copy score (16).
    copy_len : int
        Tokens per copy (16; the score averages the second copy's last ``copy_len - 1``).
    device : str
        Where the model runs and the capture computes: ``cpu`` or ``cuda`` (``cuda:N``). An execution setting, not
        in the cache key (:data:`MEASURE_EXECUTION_FIELDS`).
    dtype : str
        Compute dtype of the model (``float32``; part of the cache key).
    """

    docs: int = 16
    samples_per_bucket: float = 8.0
    eval_windows: int = 16
    sink_windows: int = 4
    copy_windows: int = 16
    copy_len: int = 16
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("docs", "eval_windows", "sink_windows", "copy_windows"):
            if getattr(self, name) < 1:
                raise MeasureSettingsError(f"measure setting {name} must be >= 1, got {getattr(self, name)}")
        if self.copy_len < 2:
            raise MeasureSettingsError(f"measure setting copy_len must be >= 2 (the score skips a copy's first token), "
                                       f"got {self.copy_len}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise MeasureSettingsError(f"measure setting device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")

    def result_key(self) -> dict:
        """The settings that can change a measured value: all but :data:`MEASURE_EXECUTION_FIELDS`."""
        return {k: v for k, v in asdict(self).items() if k not in MEASURE_EXECUTION_FIELDS}

    def capture_options(self, out, model: str, window: int) -> CaptureOptions:
        bucket = window // 16
        return CaptureOptions(model=model, corpus=str(Path(out) / "data" / "heldout.jsonl"), docs=self.docs,
                              seq_len=window, bucket_size=bucket, samples_per_bucket=min(self.samples_per_bucket, bucket),
                              heads=None, short_docs="skip", device=self.device, dtype=self.dtype, seed=0)


def window_kinds(config: TrainConfig) -> dict[str, int]:
    """The windows every checkpoint is measured at, by name: ``{"L": window, "4L": ext_window}`` (the second named
    ``f"{ext_factor}L"``)."""
    return {"L": config.window, f"{config.ext_factor}L": config.ext_window}


def checkpoint_rows(config: TrainConfig, training: dict) -> pd.DataFrame:
    """One row per (checkpoint, window measured): seed, arm, branch, step, fraction of its stage, window, theta.

    Every checkpoint, whatever its arm, is measured at both windows of :func:`window_kinds`: ``window_kind`` is
    ``"L"`` (stage A's window) or ``"4L"`` (the extension window); ``train_window`` is the window the checkpoint
    was trained at.
    """
    rows = []
    for run in training["runs"]:
        arm, total = run["arm"], config.steps_of(run["arm"])
        for branch, step in run["branches"].items():
            for kind, window in window_kinds(config).items():
                rows.append({"seed": run["seed"], "arm": arm, "branch": branch, "step": step, "fraction": step / total,
                             "window_kind": kind, "window": window, "train_window": config.window_of(arm),
                             "rope_theta": run["rope_theta"]})
    return pd.DataFrame(rows)


def position_profile(model, windows: np.ndarray, sink_windows: int | None = None) -> tuple[np.ndarray, float]:
    """Cross-entropy at each position ``[L - 1]`` (mean over windows) and the mean attention mass on token 0.

    The loss comes from the model's own kernel on every window; the sink mass from an eager pass (which returns
    the attention weights) over the first ``sink_windows`` windows (None: all), averaging
    ``A[layer, head, t, 0]`` over layers, heads and query positions ``t >= 1`` (position 0 attends only to
    itself). The eager pass holds every layer's ``[head, L, L]`` weights, so it is kept to a few windows.
    The model runs on its own device (``model.device``); the results come back to the CPU.
    """
    import torch

    device = model.device
    ids = torch.from_numpy(np.array(windows, np.int64))  # [window, L]; a copy: the windows may be a read-only map
    losses = []
    with torch.no_grad():
        for x in ids.to(device).split(4):  # x: [4, L], four windows a forward
            logp = torch.log_softmax(model(input_ids=x).logits[:, :-1].double(), -1)  # [4, L-1, V]
            losses.append(-logp.gather(2, x[:, 1:, None]).squeeze(2).cpu().numpy())  # [4, L-1]
        before = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            sinks = [float(torch.stack(model(input_ids=x, output_attentions=True).attentions)[:, 0, :, 1:, 0]
                           .double().mean()) for x in ids[:sink_windows, None].to(device)]  # [layer, 1, head, L, L]
        finally:
            model.set_attn_implementation(before)
    return np.concatenate(losses).mean(0), float(np.mean(sinks))


def position_bins(window: int) -> list[int]:
    """Edges of the loss-by-position bins: powers of two, ``[1, 2), [2, 4), ...``, the last ending at ``window - 1``."""
    edges = [1]
    while edges[-1] * 2 < window - 1:
        edges.append(edges[-1] * 2)
    return edges + [window - 1]


def position_segments(loss, L: int) -> dict[str, float]:
    """The position ranges the learned gates compare, from a loss by position at window ``W = len(loss) + 1``.

    ``loss_near``: positions ``[16, 32)``; ``loss_half_L``: ``[L/2, L)``; ``loss_beyond_L``: ``[L, W)`` and
    ``loss_far_half``: ``[W/2, W)`` (NaN when ``W <= L``); ``in_context_gain``:
    :func:`qkplast.train.gates.in_context_gain` at ``L`` (``loss_half_L - loss_near``; NaN below ``L = 64``,
    where the two ranges would overlap).
    """
    W = len(loss) + 1
    beyond = W > L
    return {"loss_near": position_mean(loss, 16, 32), "loss_half_L": position_mean(loss, L // 2, L),
            "loss_beyond_L": position_mean(loss, L, W) if beyond else float("nan"),
            "loss_far_half": position_mean(loss, W // 2, W) if beyond else float("nan"),
            "in_context_gain": in_context_gain(loss, L) if L // 2 >= 32 else float("nan")}  # NaN: the gate fails


def _stage_window(out: Path, window: int) -> int:
    """Stage A's window from ``training.json`` (``window`` when the directory has none)."""
    path = out / "training.json"
    return int(json.loads(path.read_text())["config"]["window"]) if path.exists() else window


def measure_checkpoint(out, seed: int, branch: str, window: int, settings: MeasureSettings = MeasureSettings(),
                       analysis: AnalysisOptions = AnalysisOptions(), stage_window: int | None = None) -> dict:
    """Every gate's input and the head-mean geometry of checkpoint ``branch`` of ``seed`` at ``window``.

    One model load (on ``settings.device``) gives: the loss by position on the held-out evaluation windows, binned
    by :func:`position_bins` and cut by :func:`position_segments` at stage A's window ``stage_window`` (None: read
    from ``out/training.json``); the sink mass and :func:`qkplast.train.gates.sink_ratio`; the copy score
    (``copy_loss``, the second copy; ``copy_first_loss``, the first, the no-copy reference) on
    ``settings.copy_windows`` held-out windows (at most as many as there are) from
    :func:`qkplast.train.data.copy_windows`; the capture's head means
    (:data:`HEAD_MEANS`), with ``bias_x_window`` and ``abs_bias_x_window``, the bias strength (a slope per token)
    times the window in tokens.
    """
    from qkplast.analysis.metrics import analyze
    from qkplast.capture.corpus import open_corpus, prefix_tokens
    from qkplast.capture.driver import capture
    from qkplast.capture.models import load_model

    out = Path(out)
    L = stage_window or _stage_window(out, window)
    path = snapshot(hub_cache(out), repo_id(seed), branch)
    options = settings.capture_options(out, str(path), window)
    with quiet_loading():
        loaded = load_model(str(path), device=settings.device, dtype=settings.dtype, seq_len=window,
                            local_files_only=True)
    data = load_data(out)
    # a checkpoint of a ``bos`` training carries a tokenizer that puts <|endoftext|> in front: its windows start so
    bos = prefix_tokens(loaded.tokenizer) == [data.eot]
    held = with_bos(data.heldout_stream[: settings.eval_windows, :window], bos, data.eot)  # [eval_windows, window]
    loss, sink = position_profile(loaded.model, held, settings.sink_windows)  # loss[i]: token i + 1 from tokens 0..i
    pool = data.heldout_stream[:, :window]
    copies, first, second = copy_windows(pool, min(settings.copy_windows, len(pool)), settings.copy_len,
                                         np.random.default_rng(COPY_SEED), vocab_size=loaded.model.config.vocab_size,
                                         eot=data.eot)
    copies = with_bos(copies, bos, data.eot)
    carry = first >= 0  # the rows that carry a span
    copied = copy_score(loaded.model, copies[carry], first[carry], second[carry], settings.copy_len)
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
    row.update(position_segments(loss, L), copy_loss=copied["second"], copy_first_loss=copied["first"],
               sink_ratio=sink_ratio(sink, window), bias_x_window=row["bias_strength"] * window,
               abs_bias_x_window=row["abs_bias_strength"] * window, device=settings.device)
    return row


def checkpoint_table(out, config: TrainConfig, training: dict, settings: MeasureSettings = MeasureSettings(),
                     analysis: AnalysisOptions = AnalysisOptions(), progress: bool = True,
                     workers: int = 1) -> pd.DataFrame:
    """:func:`measure_checkpoint` for every row of :func:`checkpoint_rows`, cached in ``out/geometry/``.

    A cached measurement is reused when its commit, window, stage-A window and settings match
    (:meth:`MeasureSettings.result_key`: the device is not part of it); identical checkpoints (the control arm's
    step 0 is the final stage-A checkpoint) are measured once. Each row's cache file is written (atomically) as soon
    as it is measured, so a killed table resumes from the rows already written.

    Parameters
    ----------
    workers : int
        Rows measured at once. 1: in this process, one after the other. More: each missing row is measured in one
        of ``workers`` spawned processes (each with ``cpu_count // workers`` torch threads, and on a GPU its own
        CUDA context); this process only waits and reads the cache, and never initialises CUDA. Spawned
        processes import the caller's main module: a script calling with workers guards its top level with
        ``if __name__ == "__main__":`` (a notebook needs nothing).
    """
    from qkplast.progress import progress_bar

    out = Path(out)
    rows = checkpoint_rows(config, training)
    entries = [_cache_entry(out, r, settings, analysis, config.window) for r in rows.itertuples()]
    pool, pending = _start_workers(out, rows, entries, settings, analysis, config.window, workers)
    measured = []
    for r in progress_bar(rows.itertuples(), total=len(rows), desc="checkpoints", enabled=progress, mininterval=20):
        cache, key = entries[r.Index]
        if cache in pending:
            _wait(pool, pending[cache])
        row = _read_cache(cache, key)
        if row is None:  # only without workers: with them every missing row is pending
            row = _measure_job(out, cache, key, r.seed, r.branch, int(r.window), settings, analysis, config.window)
        measured.append(row)
    if pool is not None:
        pool.shutdown()
    return pd.concat([rows, pd.DataFrame(measured)], axis=1)


def _cache_entry(out: Path, r, settings: MeasureSettings, analysis: AnalysisOptions, stage_window: int):
    """(cache file, key) of one row of :func:`checkpoint_rows`; a cached row whose key differs is measured again."""
    commit = branches(hub_cache(out), repo_id(r.seed))[r.branch]
    key = {"commit": commit, "window": int(r.window), "stage_window": int(stage_window),
           "settings": settings.result_key(), "analysis": analysis.result_key(), "metrics_schema": SCHEMA_VERSION}
    return out / "geometry" / f"{commit}-w{r.window}.json", key


def _read_cache(cache: Path, key: dict) -> dict | None:
    try:
        cached = json.loads(cache.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return cached["row"] if cached.get("key") == key else None


def _measure_job(out, cache: Path, key: dict, seed: int, branch: str, window: int, settings: MeasureSettings,
                 analysis: AnalysisOptions, stage_window: int, threads: int | None = None) -> dict:
    """Measure one row and write its cache file (a temporary file renamed: a killed job leaves no half a file)."""
    if threads is not None:  # a worker process: its share of the cores
        import torch

        torch.set_num_threads(threads)
    row = measure_checkpoint(out, seed, branch, window, settings, analysis, stage_window=stage_window)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "row": row}))
    os.replace(tmp, cache)
    return row


def _start_workers(out: Path, rows: pd.DataFrame, entries: list, settings: MeasureSettings,
                   analysis: AnalysisOptions, stage_window: int, workers: int):
    """(pool, {cache file: future}) measuring every row not cached yet in spawned processes; (None, {}) when
    ``workers`` is 1 or nothing is missing."""
    if int(workers) != workers or workers < 1:
        raise MeasureSettingsError(f"workers must be an integer >= 1, got {workers}")
    missing = {}
    for r, (cache, key) in zip(rows.itertuples(), entries):
        if cache not in missing and _read_cache(cache, key) is None:
            missing[cache] = (key, int(r.seed), r.branch, int(r.window))
    if workers == 1 or not missing:
        return None, {}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, never fork: a forked child of a process that holds CUDA or torch's threads is unsafe
    pool = ProcessPoolExecutor(max_workers=min(workers, len(missing)), mp_context=multiprocessing.get_context("spawn"))
    threads = max(1, (os.cpu_count() or 1) // workers)
    pending = {cache: pool.submit(_measure_job, Path(out), cache, key, seed, branch, window, settings, analysis,
                                  stage_window, threads)
               for cache, (key, seed, branch, window) in missing.items()}
    return pool, pending


def _wait(pool, future) -> None:
    """The row of ``future`` measured; on any failure (an interrupt included) the rows not started are cancelled."""
    try:
        future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise


#: The window names of tables before every checkpoint was measured at both windows (chapter 10 until its rewrite).
OLD_WINDOW_KINDS = ("own", "ext")


def _at_window(table: pd.DataFrame, arm: str, window_kind: str) -> pd.DataFrame:
    """Rows of ``arm`` measured at ``window_kind``; the names of old tables map: ``"own"`` is the window the
    checkpoint was trained at, ``"ext"`` the extension window (the longest window of the table)."""
    sub = table[table.arm == arm]
    if (sub.window_kind == window_kind).any() or window_kind not in OLD_WINDOW_KINDS:
        return sub[sub.window_kind == window_kind]
    if window_kind == "own":
        return sub[sub.window == sub.train_window] if "train_window" in sub else sub.iloc[:0]
    return sub[sub.window == table.window.max()]



def locate(table: pd.DataFrame, arm: str, fraction, window_kind: str = "own",
           events: dict | None = None) -> pd.DataFrame:
    """Rows of ``arm`` at one checkpoint per seed, measured at ``window_kind``.

    Parameters
    ----------
    table : DataFrame
        :func:`checkpoint_table`'s rows.
    arm : str
        ``stageA`` or an extension arm.
    fraction : float or str
        A share of the arm's stage: the checkpoint whose share is nearest it (the same for every seed); or the name
        of an event of ``events`` (e.g. ``"early"``): each seed's own checkpoint (seeds without the event are left
        out).
    window_kind : str
        ``"L"`` or ``"4L"`` (:func:`window_kinds`); the older ``"own"`` (the window the checkpoint was trained at)
        and ``"ext"`` (the extension window) map onto them.
    events : dict, optional
        ``{name: Series seed -> step}``, e.g. ``{"early": qkplast.train.gates.early_checkpoint(table, unigram)}``.

    Returns
    -------
    DataFrame
        Indexed by seed, sorted.
    """
    sub = _at_window(table, arm, window_kind)
    if sub.empty:
        raise KeyError(f"no checkpoint of arm {arm!r} measured at its {window_kind!r} window")
    if isinstance(fraction, str):
        if events is None or fraction not in events:
            raise KeyError(f"event {fraction!r} is not defined: pass events={{{fraction!r}: Series seed -> step}} "
                           f"(e.g. qkplast.train.gates.early_checkpoint); events given: {sorted(events or {})}")
        step = sub.seed.map(events[fraction])  # [row]: the event's step of the row's seed (NaN: none)
        return sub[sub.step == step].set_index("seed").sort_index()
    nearest = sub.fraction.iloc[np.argmin(np.abs(sub.fraction.values - fraction))]
    return sub[sub.fraction == nearest].set_index("seed").sort_index()


def place_label(place) -> str:
    """``(arm, share or event, window_kind)`` as ``arm@10% (L)`` or ``arm@early (L)``."""
    arm, where, kind = place
    return f"{arm}@{where if isinstance(where, str) else format(where, '.0%')} ({kind})"


#: Columns of :func:`seed_readings`.
READING_COLUMNS = ["metric", "from", "to", "claim", "margin", "estimate", "lo", "hi", "p", "p_holm", "seeds",
                   "holm_level", "detectable", "verdict"]


def _failed_gates(place, rows: pd.DataFrame, table: pd.DataFrame, gates: pd.DataFrame | None) -> list[str]:
    """The gates failed by the checkpoints a reading reads at ``place`` (``rows``: one per seed)."""
    from qkplast.train.gates import GATES

    failed = []
    if isinstance(place[1], str) and set(table.seed) - set(rows.index):
        failed.append(place[1])  # a seed without the event (it never left the unigram plateau)
    if gates is not None:
        lookup = gates.set_index(["seed", "arm", "step"])
        keys = [(seed, r.arm, r.step) for seed, r in rows.iterrows()]
        found = [k for k in keys if k in lookup.index]
        if len(found) < len(keys):
            failed.append("ungated")
        failed += [g for g in GATES if any(_fails(lookup.loc[k, f"{g}_pass"]) for k in found)]
    return failed


def _fails(passed) -> bool:
    """A gate's pass value failed: False (a Python or a numpy bool); None or NaN: the gate does not apply."""
    return passed is not None and not pd.isna(passed) and not bool(passed)


def seed_readings(table: pd.DataFrame, readings: dict, level: float = 0.95, gates: pd.DataFrame | None = None,
                  events: dict | None = None, alpha: float = 0.05, power: float = 0.8) -> pd.DataFrame:
    """The pre-registered readings decided from the seeds, on the checkpoints that passed the learned gates.

    Each reading is ``{"metric", "from": (arm, place, window_kind), "to": (...), "claim", "margin"}``: the
    contrast is ``metric`` at ``to`` minus at ``from``, one value per seed; a place is a share of the arm's stage
    (``0.1``) or an event of ``events`` (``"early"``), see :func:`locate`. Student's t interval over the seeds
    (:func:`qkplast.stats.intervals.t_interval`) and its p-value, then the family's decision
    (:func:`qkplast.stats.decision.decide_family`: Holm's correction across the directional readings and the
    verdict word; an equivalence reading is decided by its interval against its margin). A reading with ``"claim": None`` is
    exploratory: its interval is shown, no verdict is given and it does not enter the correction.

    With ``gates`` (:func:`qkplast.train.gates.seed_gates`), a reading whose 'from' or 'to' checkpoint failed a
    gate in some seed (or whose event some seed lacks) gets the verdict ``"not testable (gate: ...)"`` naming the
    gates, and enters no Holm family; its interval is still shown.

    Beside each directional reading of the family: ``holm_level``, the level Holm's step-down tests it at
    (``alpha / (m - i)`` for the ``i``-th smallest of ``m`` p-values), and ``detectable``, the smallest mean contrast
    the t test over its seeds detects with probability ``power`` at that level
    (:func:`qkplast.stats.power.detectable_effect` times the seeds' standard deviation of the contrast), in the
    metric's units; NaN for the others.
    """
    from qkplast.stats.decision import decide_family
    from qkplast.stats.intervals import t_interval

    rows = []
    for name, r in readings.items():
        a, b = locate(table, *r["from"], events=events), locate(table, *r["to"], events=events)
        failed = _failed_gates(r["from"], a, table, gates) + _failed_gates(r["to"], b, table, gates)
        failed = list(dict.fromkeys(failed))  # each gate named once, in order
        contrast = (b[r["metric"]] - a[r["metric"]]).dropna()  # [seed]
        t = t_interval(contrast.values, level=level)
        rows.append({"reading": name, "metric": r["metric"], "from": place_label(r["from"]),
                     "to": place_label(r["to"]), "claim": r.get("claim"), "margin": r.get("margin"),
                     "estimate": float(t["estimate"]), "lo": float(t["lo"]), "hi": float(t["hi"]),
                     "p": float(t["p"]), "seeds": int(t["n"]), "sd": float(t["se"] * np.sqrt(t["n"])),
                     "failed": failed})
    out = pd.DataFrame(decide_family(rows, alpha, power)).set_index("reading")
    return out[READING_COLUMNS]


#: Chapter 10's registered predictions, readings and decision rule (committed before the run they decide).
READINGS_FILE = "miniature-readings.yaml"


def load_readings(config: TrainConfig, path=None) -> tuple[dict, dict, dict]:
    """The registered readings of ``studies/miniature-readings.yaml`` in :func:`seed_readings`' form.

    A place ``[arm, point, window]`` of the file becomes ``(arm, share or event, window_kind)``: ``"end"`` is the
    arm's last checkpoint (share 1), ``"branch"`` the stage-A checkpoint the arms start from
    (``config.ext_start / config.steps``), ``"early"`` stays the event of that name
    (:func:`qkplast.train.gates.early_checkpoint`), a number is a share of the arm's stage.

    Returns
    -------
    readings : dict
        ``{name: {"metric", "from", "to", "claim", "margin", "text"}}``.
    predictions : dict
        ``{prediction: [reading names]}``.
    document : dict
        The whole file (``decision_rule``, ``gates``, ``amendment``).
    """
    import yaml

    from qkplast.resources import resource_dir

    path = Path(path) if path is not None else resource_dir("studies") / READINGS_FILE
    document = yaml.safe_load(Path(path).read_text())

    def place(spec):
        arm, point, window = spec
        share = {"end": 1.0, "branch": config.ext_start / config.steps}.get(point, point)
        return (arm, share if isinstance(share, str) else float(share), window)

    readings = {name: {"metric": r["metric"], "from": place(r["from"]), "to": place(r["to"]),
                       "claim": r.get("claim"), "margin": r.get("margin"), "text": r.get("text", "")}
                for name, r in document["readings"].items()}
    predictions = {str(k): list(v) for k, v in document["predictions"].items()}
    return readings, predictions, document


def decisive_steps(config: TrainConfig) -> dict:
    """The checkpoints the registered gates are read at: stage A's last step and the branch the arms start from,
    and each arm's last step (:func:`qkplast.train.gates.registered_gates`)."""
    return {"stageA": sorted({config.steps, config.ext_start}), **{arm: [config.ext_steps] for arm in config.arms}}


def save_full_run(target, training: dict, table: pd.DataFrame, baseline: dict, provenance: dict) -> None:
    """Write a finished training's data as chapter 10 reads it (``data/miniature-full/``): ``training.json``,
    ``checkpoints.json`` (:func:`checkpoint_table`'s rows, lists kept) and ``provenance.json`` (with the held-out
    ``baseline`` of :func:`qkplast.train.gates.heldout_bigram_baseline`)."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    (target / "training.json").write_text(json.dumps(training, indent=1))
    (target / "checkpoints.json").write_text(table.to_json(orient="records", indent=1))
    (target / "provenance.json").write_text(json.dumps({**provenance, "baseline": baseline}, indent=1, default=str))


def load_full_run(path) -> dict:
    """A committed full run (:func:`save_full_run`): ``{"config", "training", "table", "baseline", "provenance",
    "path"}``.

    Raises
    ------
    FileNotFoundError
        ``path`` lacks one of the three files (the message names it and the command that writes them).
    """
    from qkplast.train.config import TrainConfig

    path = Path(path)
    for name in ("training.json", "checkpoints.json", "provenance.json"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path / name} is missing: the full run's data is written by "
                                    f"benchmarks/bench_miniature.py --export {path}")
    training = json.loads((path / "training.json").read_text())
    provenance = json.loads((path / "provenance.json").read_text())
    table = pd.DataFrame(json.loads((path / "checkpoints.json").read_text()))
    return {"config": TrainConfig.from_kwargs(**training["config"]), "training": training, "table": table,
            "baseline": provenance["baseline"], "provenance": provenance, "path": path}
