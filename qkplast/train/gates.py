"""Learned gates: has the miniature learned what a prediction is about, before any of its geometry is read?

Issue 36 ("Learned gates, before any geometry is read"): a prediction is decided only on checkpoints whose
seeds all pass every gate; otherwise it reads **not testable**, with the gate that failed named. "Not testable"
(the model has not learned the thing the prediction is about) is distinct from "left open" (the model has, but
the seeds cannot tell the effect from zero). The gates and their thresholds (:class:`GateConfig`):

* ``heldout``: the held-out loss at least 0.5 nats below a held-out bigram baseline
  (:func:`heldout_bigram_baseline`);
* ``in_context``: the loss at positions ``[L/2, L)`` minus the loss at positions ``[16, 32)`` at most -0.05
  nats (:func:`in_context_gain`);
* ``copy``: on held-out windows carrying a span of random tokens repeated at a random distance, the second
  copy's loss at most half of ``ln V`` (:func:`copy_score`; an induction score, as Olsson et al. 2022 measure it);
* ``sink``: the attention mass on the first token at least twice its value under uniform attention
  (:func:`sink_ratio`);
* extension manipulation checks, on the extension window ``E`` (4L): ``reach``, the rescaled arm's loss at
  positions ``[E/2, E)`` not above its loss at ``[L/2, L)``; ``control_worse``, the control arm's loss at
  ``[L, E)`` above the rescaled arm's at the same seed and step.

Positions count tokens of context: position ``p`` is the loss of token ``p`` of a window predicted from tokens
``0 .. p - 1``, entry ``p - 1`` of :func:`qkplast.train.evaluate.position_profile`'s loss.

The kernels are pure functions of arrays (testable on planted numbers); :func:`seed_gates` applies them to the
rows of :func:`qkplast.train.evaluate.checkpoint_table`, :func:`decidable` folds the seeds of each checkpoint,
and :func:`early_checkpoint` defines the event "early" (the first stage-A checkpoint off the unigram plateau).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qkplast.errors import QkplastError
from qkplast.stats import decision

__all__ = ["EXTENSION_CHECKS", "GATES", "GateConfig", "GateConfigError", "LEARNING_GATES", "NOT_TESTABLE", "copy_score",
           "decidable", "early_checkpoint", "heldout_bigram_baseline", "in_context_gain", "not_testable",
           "position_mean", "registered_gates", "seed_gates", "sink_ratio", "uniform_sink"]

#: The gates, in the order they are printed; the last two apply to the rescaled and control arms only.
GATES = ("heldout", "in_context", "copy", "sink", "reach", "control_worse")

#: The verdict word of a reading on a checkpoint that failed a gate (distinct from "left open"); its home is the
#: verdict rule's module.
NOT_TESTABLE = decision.NOT_TESTABLE
not_testable = decision.not_testable  # the verdict word of a reading on checkpoints that failed gates


class GateConfigError(QkplastError):
    """A gate threshold is out of range."""


@dataclass(frozen=True)
class GateConfig:
    """Every threshold of the learned gates (issue 36), committed before the full run.

    heldout_margin : float
        ``heldout``: the held-out loss must lie at least this many nats below the held-out bigram baseline
        (0.5; issue 36: "held-out loss at least 0.5 nats below a held-out bigram baseline").
    in_context_max : float
        ``in_context``: the loss at positions ``>= L/2`` (within the window ``L``) minus the loss at positions
        ``near`` must be at most this (-0.05 nats; issue 36: "loss at positions >= L/2 minus loss at positions
        16-32 at most -0.05 nats").
    near : tuple of int
        The positions ``[near[0], near[1])`` of that contrast ((16, 32): where the issue's undertrained model's
        loss bottomed out).
    copy_share : float
        ``copy``: the second copy's mean loss at most ``copy_share * ln V`` nats per token (0.5; issue 36: "the
        second copy's loss at most half of ln V").
    sink_factor : float
        ``sink``: the first-token attention mass at least ``sink_factor`` times its uniform value (2; issue 36:
        "first-token attention mass at least twice the uniform value").
    reach_max : float
        ``reach``: the rescaled arm's loss at positions ``[E/2, E)`` minus its loss at ``[L/2, L)`` at most this
        (0; issue 36: "the rescaled arm's loss at positions in [2L, 4L) not above its loss in [L/2, L)").
    control_min : float
        ``control_worse``: the control arm's loss at ``[L, E)`` minus the rescaled arm's there must exceed this
        (0; issue 36: "the control arm's worse beyond L").
    early_margin : float
        The event "early" (:func:`early_checkpoint`): the first stage-A checkpoint whose held-out loss lies at least
        this many nats below the held-out unigram cross-entropy (0.25; issue 36: "Early is an event, not a share of
        steps: the first checkpoint after the loss leaves the unigram plateau").
    """

    heldout_margin: float = 0.5
    in_context_max: float = -0.05
    near: tuple[int, int] = (16, 32)
    copy_share: float = 0.5
    sink_factor: float = 2.0
    reach_max: float = 0.0
    control_min: float = 0.0
    early_margin: float = 0.25

    def __post_init__(self):
        object.__setattr__(self, "near", tuple(int(p) for p in self.near))
        problems = []
        if len(self.near) != 2 or not 1 <= self.near[0] < self.near[1]:
            problems.append(f"near must be two positions 1 <= a < b, got {self.near}")
        if not 0 < self.copy_share <= 1:
            problems.append(f"copy_share must lie in (0, 1], got {self.copy_share}")
        for name in ("heldout_margin", "sink_factor", "early_margin"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                problems.append(f"{name} must be a finite number >= 0, got {getattr(self, name)}")
        for message in problems:
            raise GateConfigError(f"gate setting {message}")


# --------------------------------------------------------------------------- kernels


def heldout_bigram_baseline(stream, heldout_windows, vocab_size: int,
                            ks=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)) -> dict:
    """Unigram and bigram cross-entropies on held-out text, the bigram's smoothing chosen out of sample.

    Both models are counted on the training ``stream``: the unigram with add-one counts,
    ``p(b) = (c(b) + 1) / (N + V)``; the bigram with add-k counts interpolated with that unigram,
    ``p(b | a) = (c(a, b) + k p(b)) / (c(a) + k)``. The held-out windows are split in two halves, the even-numbered
    windows and the odd-numbered ones: ``k`` is the value of ``ks`` with the lowest cross-entropy on the first half
    and the cross-entropies are reported on the second, so the baseline is not fitted to the text it scores.
    Pairs are those inside a window (its ``L - 1`` next-token predictions).

    Parameters
    ----------
    stream : array_like of int
        The training tokens, ``[token]``.
    heldout_windows : array_like of int
        Held-out windows ``[window, L]`` (at least two), tokenized with the same tokenizer.
    vocab_size : int
        ``V``; every token lies in ``[0, V)``.
    ks : sequence of float
        The candidate interpolation weights (from nearly the plain bigram to nearly the unigram; the smoke
        preset's small training stream picks 30, so the grid reaches well past it).

    Returns
    -------
    dict
        ``unigram``, ``bigram``: cross-entropies in nats per token on the scoring half; ``k``: the chosen weight;
        ``bigram_fit``: the bigram's cross-entropy on the fitting half at that ``k``; ``fit_windows``,
        ``score_windows``: the halves' sizes.
    """
    V = int(vocab_size)
    s = np.asarray(stream, np.int64).ravel()
    h = np.asarray(heldout_windows, np.int64)
    if h.ndim != 2 or h.shape[0] < 2 or h.shape[1] < 2:
        raise ValueError(f"heldout_windows must be [window, L] with at least two windows of two tokens, got {h.shape}")
    if s.size < 2 or s.min() < 0 or h.min() < 0 or max(s.max(), h.max()) >= V:
        raise ValueError(f"tokens must lie in [0, vocab_size={V}) and the stream hold at least two")
    uni = np.bincount(s, minlength=V).astype(np.float64)  # [V]
    p_uni = (uni + 1) / (uni.sum() + V)
    prev = np.bincount(s[:-1], minlength=V).astype(np.float64)  # [V]: c(a), a bigram's first token
    pairs = np.sort(s[:-1] * V + s[1:])  # [N - 1] sorted codes: counts by binary search, no V x V table

    def nll(windows: np.ndarray, k: float) -> float:
        a, b = windows[:, :-1].ravel(), windows[:, 1:].ravel()
        code = a * V + b
        c_ab = (np.searchsorted(pairs, code, "right") - np.searchsorted(pairs, code, "left")).astype(np.float64)
        return float(-np.mean(np.log((c_ab + k * p_uni[b]) / (prev[a] + k))))

    fit, score = h[0::2], h[1::2]
    k = min(ks, key=lambda k: nll(fit, k))
    return {"unigram": float(-np.mean(np.log(p_uni[score[:, 1:].ravel()]))), "bigram": nll(score, k), "k": float(k),
            "bigram_fit": nll(fit, k), "fit_windows": int(len(fit)), "score_windows": int(len(score))}


def position_mean(loss, lo: int, hi: int) -> float:
    """Mean loss at positions ``[lo, hi)`` (``loss[p - 1]`` is position ``p``); NaN when the window ends before
    ``hi``."""
    loss = np.asarray(loss, np.float64)
    if not 1 <= lo < hi:
        raise ValueError(f"positions must satisfy 1 <= lo < hi, got [{lo}, {hi})")
    return float(loss[lo - 1: hi - 1].mean()) if hi - 1 <= loss.shape[-1] else float("nan")


def in_context_gain(loss_by_position, L: int, near: tuple[int, int] = (16, 32)) -> float:
    """The ``in_context`` gate's value: mean loss at positions ``[L/2, L)`` minus at positions ``near``.

    Negative when the model predicts better with more context. Only positions inside stage A's window ``L`` enter,
    so the value is the same quantity whether the checkpoint is read at ``L`` or at the extension window.

    Parameters
    ----------
    loss_by_position : array_like
        Cross-entropy at each position, ``[W - 1]`` with ``W >= L`` (entry ``p - 1`` is position ``p``).
    L : int
        Stage A's window; ``L / 2`` must be at least ``near[1]`` (the two position ranges do not overlap).
    """
    if L // 2 < near[1]:
        raise ValueError(f"in_context_gain compares positions [{L // 2}, {L}) with {list(near)}: they overlap; "
                         f"it needs a window L >= {2 * near[1]}")
    if len(loss_by_position) < L - 1:
        raise ValueError(f"loss_by_position has {len(loss_by_position)} positions; the window L={L} needs {L - 1}")
    return position_mean(loss_by_position, L // 2, L) - position_mean(loss_by_position, *near)


def uniform_sink(window) -> np.ndarray | float:
    """First-token attention mass of uniform causal attention: the mean over query positions ``t = 1 .. W - 1`` of
    ``1 / (t + 1)``, i.e. ``(H_W - 1) / (W - 1)`` with ``H_W`` the ``W``-th harmonic number."""
    from scipy.special import digamma

    w = np.asarray(window, np.float64)
    if np.any(w < 2):
        raise ValueError(f"a window needs at least two positions, got {window}")
    out = (digamma(w + 1) + np.euler_gamma - 1) / (w - 1)
    return float(out) if out.ndim == 0 else out


def sink_ratio(sink_mass, window):
    """The ``sink`` gate's value: the mean first-token attention mass over its uniform value at ``window``
    (:func:`uniform_sink`; the mass is averaged over the same query positions ``t >= 1``)."""
    ratio = np.asarray(sink_mass, np.float64) / uniform_sink(window)
    return float(ratio) if ratio.ndim == 0 else ratio


def copy_score(model, windows, first, second, copy_len: int, batch: int = 4) -> dict:
    """Loss on the two copies of a repeated span of random tokens: the ``copy`` gate's value and its reference.

    Each window ``i`` carries the same ``copy_len`` tokens at ``first[i]`` and at ``second[i] > first[i]``
    (:func:`qkplast.train.data.copy_windows`). A model that copies predicts every token of the second copy but its
    first from the first copy: the mean loss over the second copy's tokens ``1 .. copy_len - 1`` (its first token
    cannot be predicted: nothing says where the repeat starts) is the induction score. The same tokens of the first
    copy, which are random and unseen, are the no-copy reference (about ``ln V`` or more).

    Parameters
    ----------
    model : callable
        ``model(input_ids=x).logits`` is ``[batch, W, V]``, as a transformers causal LM gives; run on
        ``model.device`` when it has one.
    windows : array_like of int
        ``[n, W]`` windows carrying the copies.
    first, second : array_like of int
        ``[n]`` start positions of the first and the second copy.
    copy_len : int
        Tokens per copy (at least 2).
    batch : int
        Windows per forward pass.

    Returns
    -------
    dict
        ``second``: the second copy's mean loss in nats per token (the gate's value); ``first``: the first
        copy's; ``tokens``: tokens scored per copy.
    """
    import torch

    x = torch.as_tensor(np.array(windows, np.int64))  # [n, W]; a copy: the windows may be read-only
    first, second = (torch.as_tensor(np.asarray(v, np.int64)).reshape(-1) for v in (first, second))
    if copy_len < 2 or len(first) != len(x) or len(second) != len(x):
        raise ValueError(f"copy_score needs copy_len >= 2 and one first and second start per window, got copy_len "
                         f"{copy_len}, {len(x)} windows, {len(first)} and {len(second)} starts")
    if bool((second < first + copy_len).any()) or int(second.max()) + copy_len > x.shape[1] or int(first.min()) < 0:
        raise ValueError("each second copy must start after the first ends and end inside the window")
    device = getattr(model, "device", "cpu")
    offsets = torch.arange(1, copy_len)  # [c - 1]: the copy's tokens after its first
    losses = {"first": [], "second": []}
    with torch.no_grad():
        for rows in torch.arange(len(x)).split(batch):
            xb = x[rows]
            logp = torch.log_softmax(model(input_ids=xb.to(device)).logits[:, :-1].double(), -1)  # [b, W-1, V]
            nll = -logp.gather(2, xb[:, 1:, None].to(logp.device)).squeeze(2).cpu()  # [b, W-1]: nll[:, p-1], token p
            for name, start in (("first", first[rows]), ("second", second[rows])):
                losses[name].append(nll.gather(1, start[:, None] + offsets - 1))  # [b, c - 1]
    return {name: float(torch.cat(v).mean()) for name, v in losses.items()} | {"tokens": copy_len - 1}


# --------------------------------------------------------------------------- gates per seed and checkpoint


def _table(table_or_rows) -> pd.DataFrame:
    return table_or_rows if isinstance(table_or_rows, pd.DataFrame) else pd.DataFrame(list(table_or_rows))


def seed_gates(table_or_rows, bigram: float, vocab_size: int, window: int,
               gates: GateConfig = GateConfig()) -> pd.DataFrame:
    """Every gate of every (seed, checkpoint): its value, threshold and pass/fail.

    Parameters
    ----------
    table_or_rows : DataFrame or iterable of dict
        Rows of :func:`qkplast.train.evaluate.checkpoint_table` (``seed``, ``arm``, ``step``, ``window`` and the
        measured ``loss``, ``in_context_gain``, ``copy_loss``, ``sink_ratio``, ``loss_half_L``,
        ``loss_far_half``, ``loss_beyond_L``). The first four gates read the row measured at ``window``; the
        extension checks read the row at the longer window.
    bigram : float
        The held-out bigram baseline (:func:`heldout_bigram_baseline`'s ``bigram``).
    vocab_size : int
        ``V`` (the copy gate's threshold is ``copy_share * ln V``).
    window : int
        Stage A's window ``L``.
    gates : GateConfig
        The thresholds.

    Returns
    -------
    DataFrame
        One row per (seed, arm, step), with ``branch`` and ``fraction`` when the table has them; for each gate
        ``g`` of :data:`GATES`: ``g`` (its value), ``g_threshold`` and ``g_pass`` (True, False, or None where the
        gate does not apply to the arm; a gate that applies but whose value is missing fails); ``passed`` (every
        applicable gate passed) and ``failed`` (the failed gates' names, comma-separated).
    """
    if gates.near != (16, 32):  # the table's in_context_gain was measured at [16, 32) (evaluate.position_segments)
        raise GateConfigError(f"gate setting near={gates.near}: the checkpoint table measures the in-context gain at "
                              "positions (16, 32); keep near=(16, 32) or recompute in_context_gain from the profile")
    t = _table(table_or_rows)
    keys = ["seed", "arm", "step"]
    at_L = t[t.window == window].set_index(keys)
    long = t[t.window > window].set_index(keys)
    rescaled = long.xs("rescaled", level="arm") if "rescaled" in long.index.get_level_values("arm") else None
    rules = {  # name: (value per row, threshold, passes)
        "heldout": (at_L.loss - bigram, -gates.heldout_margin, np.less_equal),
        "in_context": (at_L.in_context_gain, gates.in_context_max, np.less_equal),
        "copy": (at_L.copy_loss, gates.copy_share * math.log(vocab_size), np.less_equal),
        "sink": (at_L.sink_ratio, gates.sink_factor, np.greater_equal),
    }
    out = at_L[[c for c in ("branch", "fraction") if c in at_L]].copy()
    for name, (value, threshold, passes) in rules.items():
        out[name], out[f"{name}_threshold"] = value.astype(float), threshold
        out[f"{name}_pass"] = pd.Series([bool(passes(v, threshold)) if np.isfinite(v) else False for v in out[name]],
                                        index=out.index, dtype=object)  # Python bools, as the extension checks
    checks = (("reach", "rescaled", gates.reach_max), ("control_worse", "control", gates.control_min))
    for name, arm, threshold in checks:
        value, applies = [], []
        for seed, row_arm, step in out.index:
            applies.append(row_arm == arm)
            if row_arm != arm or (seed, row_arm, step) not in long.index:
                value.append(np.nan)
                continue
            r = long.loc[(seed, row_arm, step)]
            if name == "reach":
                value.append(r.loss_far_half - r.loss_half_L)
            else:
                other = rescaled.loc[(seed, step)] if rescaled is not None and (seed, step) in rescaled.index else None
                value.append(np.nan if other is None else r.loss_beyond_L - other.loss_beyond_L)
        out[name] = np.asarray(value, float)
        out[f"{name}_threshold"] = [threshold if a else np.nan for a in applies]
        passes = np.less_equal if name == "reach" else np.greater
        out[f"{name}_pass"] = pd.Series([None if not a else (bool(passes(v, threshold)) if np.isfinite(v) else False)
                                         for a, v in zip(applies, out[name])], index=out.index, dtype=object)
    failed = [[g for g in GATES if row[f"{g}_pass"] is False] for _, row in out.iterrows()]
    out["passed"] = [not f for f in failed]
    out["failed"] = [", ".join(f) for f in failed]
    return out.reset_index().sort_values(keys, kind="stable").reset_index(drop=True)


def decidable(gate_rows: pd.DataFrame, seeds=None) -> pd.DataFrame:
    """Which checkpoints a prediction may be decided on: those whose seeds all pass every gate.

    Parameters
    ----------
    gate_rows : DataFrame
        :func:`seed_gates`'s rows.
    seeds : iterable of int, optional
        The seeds every checkpoint must have (a missing seed cannot pass; None: whichever the rows hold).

    Returns
    -------
    DataFrame
        Indexed by (arm, step): ``seeds`` (how many were gated), ``decidable`` (bool), ``failed`` (the gates some
        seed failed, in :data:`GATES` order, ``"missing seed"`` when an expected seed has no row) and ``status``:
        ``"decidable"`` or ``"not testable (gate: ...)"``.
    """
    expected = None if seeds is None else set(seeds)
    rows = {}
    for (arm, step), group in gate_rows.groupby(["arm", "step"], sort=False):
        failed = [g for g in GATES if (group[f"{g}_pass"] == False).any()]  # noqa: E712 (None: not applicable)
        if expected is not None and not expected <= set(group.seed):
            failed.append("missing seed")
        rows[(arm, step)] = {"seeds": int(group.seed.nunique()), "decidable": not failed, "failed": ", ".join(failed),
                             "status": "decidable" if not failed else not_testable(failed)}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(["arm", "step"])


def early_checkpoint(rows, unigram: float, gates: GateConfig = GateConfig()) -> pd.Series:
    """The event "early", per seed: the step of the first stage-A checkpoint off the unigram plateau.

    A model that has learned only how often each token occurs sits at the unigram cross-entropy; "early" is the
    first stage-A checkpoint (in step order) whose held-out loss lies at least ``gates.early_margin`` nats below
    the held-out unigram cross-entropy ``unigram`` (:func:`heldout_bigram_baseline`'s ``unigram``). It is an event
    of each seed's own run, not a share of steps (issue 36): two seeds may leave the plateau at different steps.

    Parameters
    ----------
    rows : DataFrame or iterable of dict
        Checkpoint rows with ``seed``, ``arm``, ``step``, ``loss`` (and ``window_kind``: only ``"L"`` rows are read
        when the table has that column).
    unigram : float
        The held-out unigram cross-entropy.

    Returns
    -------
    Series
        Indexed by seed (every seed with a stage-A row): the step, NaN for a seed that never leaves the plateau.
    """
    t = _table(rows)
    t = t[t.arm == "stageA"]
    if "window_kind" in t:
        t = t[t.window_kind == "L"]
    off = t[t.loss <= unigram - gates.early_margin].groupby("seed").step.min()
    return off.reindex(sorted(t.seed.unique())).astype(float).rename("early").rename_axis("seed")


#: The gates that say a seed's model learned (read at its final and branch stage-A checkpoints) and the
#: extension's manipulation checks (read at each arm's final checkpoint).
LEARNING_GATES = ("heldout", "in_context", "copy", "sink")
EXTENSION_CHECKS = ("reach", "control_worse")


def registered_gates(gate_rows: pd.DataFrame, ends: dict) -> pd.DataFrame:
    """Each checkpoint's gates under chapter 10's registered rule (``studies/miniature-readings.yaml``).

    A point of a trajectory is read on a model that learned: the learning gates (:data:`LEARNING_GATES`) of every
    checkpoint of a seed are those of that seed's decisive stage-A checkpoints (the final one and the branch the
    arms start from; both must pass), and the manipulation checks (:data:`EXTENSION_CHECKS`) of an arm's
    checkpoints are those of the arm's final checkpoint. An early checkpoint on its own never passes the learning
    gates (it is early because it has not learned yet), so gating it by its own values would make every reading
    of "early" untestable by construction.

    Parameters
    ----------
    gate_rows : DataFrame
        :func:`seed_gates`'s rows.
    ends : dict
        ``{"stageA": [final step, branch step], arm: [final step], ...}``: the decisive steps of each run.

    Returns
    -------
    DataFrame
        ``gate_rows`` with every ``g_pass`` (and ``passed``, ``failed``) replaced by the decisive checkpoints'.
    """
    rows = gate_rows.set_index(["seed", "arm", "step"]).sort_index()
    out = rows.copy()

    def all_pass(seed, arm, gate):
        values = [rows.loc[(seed, arm, step), f"{gate}_pass"] if (seed, arm, step) in rows.index else False
                  for step in ends.get(arm, [])]
        values = [v for v in values if v is not None]  # a check that does not apply to the arm
        return None if not values else bool(all(bool(v) for v in values))

    for gate in GATES:
        column = []
        for seed, arm, _ in out.index:
            if gate in LEARNING_GATES:
                column.append(all_pass(seed, "stageA", gate))
            else:
                column.append(all_pass(seed, arm, gate) if arm in ends and arm != "stageA" else None)
        out[f"{gate}_pass"] = pd.Series(column, index=out.index, dtype=object)
    failed = [[g for g in GATES if row[f"{g}_pass"] is False] for _, row in out.iterrows()]
    out["passed"] = [not f for f in failed]
    out["failed"] = [", ".join(f) for f in failed]
    return out.reset_index()
