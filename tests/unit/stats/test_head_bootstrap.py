"""The bootstrap over heads of the cross-run tables (qkplast.stats.bootstrap.head_bootstrap)."""

import numpy as np

from qkplast.stats.bootstrap import head_bootstrap


def test_head_bootstrap_interval_covers_the_mean_and_shrinks_with_more_heads():
    rng = np.random.default_rng(0)
    small, large = rng.normal(0.1, 0.05, 20), rng.normal(0.1, 0.05, 2000)
    (a, b), (c, d) = head_bootstrap(small), head_bootstrap(large)
    assert a < small.mean() < b and c < large.mean() < d and (d - c) < (b - a) / 5


def test_head_bootstrap_leaves_out_nan_heads_and_repeats_with_its_seed():
    rng = np.random.default_rng(1)
    x = rng.normal(0.2, 0.05, 40)
    with_nan = np.concatenate([x, [np.nan, np.nan]])
    assert head_bootstrap(with_nan, seed=3) == head_bootstrap(x, seed=3)  # NaN heads dropped before the draw
    assert head_bootstrap(x, seed=3) != head_bootstrap(x, seed=4)
    lo90, hi90 = head_bootstrap(x, level=0.9)
    lo, hi = head_bootstrap(x)
    assert lo < lo90 < hi90 < hi  # the same replicates, a narrower central range
