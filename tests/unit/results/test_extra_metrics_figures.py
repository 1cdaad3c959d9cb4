"""Figures of the open-questions chapter (qkplast.results.extra_metrics) on tables with known contents."""

import matplotlib
import numpy as np
import pandas as pd

from qkplast.results import extra_metrics

matplotlib.use("Agg")


def test_condition_bars_draw_an_interval_that_does_not_hold_the_plain_estimate():
    """The policy's interval is centred on the bias-corrected estimate: a bar outside it is drawn, not refused."""
    rows = [{"condition": c, "quantity": q, "estimate": e, "lo": e + off, "hi": e + off + 0.1}
            for c, off in (("baseline", -0.05), ("rope_x2", 0.02)) for q, e in (("ap_drop", 0.2), ("ap_drop_bias", 0.1))]
    fig = extra_metrics.condition_bars(pd.DataFrame(rows), quantities=("ap_drop", "ap_drop_bias"))
    ax = fig.axes[0]
    segments = np.concatenate([c.get_segments() for c in ax.collections])  # one vertical segment per bar
    assert len(segments) == 4 and len(ax.patches) == 4
    np.testing.assert_allclose(sorted(s[0, 1] for s in segments), sorted(r["lo"] for r in rows))
