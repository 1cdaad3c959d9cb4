"""Experiments: a loaded model in, interventions and behaviour out (beyond the thesis, its sections 7.5-7.6).

Head ablation and the bias clamp (:mod:`~qkplast.experiments.intervene`, calibrated layer by layer in
:mod:`~qkplast.experiments.calibrate`), behaviour by distance (:mod:`~qkplast.experiments.behavior`),
captures under controlled conditions (:mod:`~qkplast.experiments.condition_captures`) and the interventions
grid of chapter 12 (:mod:`~qkplast.experiments.head_interventions`). Their readings are in :mod:`qkplast.stats`
(:mod:`~qkplast.stats.condition_readings`, :mod:`~qkplast.stats.intervention_readings`), the grid's figures in
:mod:`~qkplast.results.intervention_figures`.
"""

from qkplast.experiments.behavior import copy_by_distance, loss_by_position, passkey_by_depth
from qkplast.experiments.calibrate import calibrate_and_capture, calibrate_clamp, capture_windows
from qkplast.experiments.intervene import ablate_heads, clamp_bias, select_heads

__all__ = ["ablate_heads", "calibrate_and_capture", "calibrate_clamp", "capture_windows", "clamp_bias",
           "copy_by_distance", "loss_by_position", "passkey_by_depth", "select_heads"]
