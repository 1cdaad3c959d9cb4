"""Figures of the intervention grid (qkplast.results.intervention_figures) on a synthetic grid with planted effects."""

import matplotlib
import numpy as np

import qkplast.stats.intervention_readings as qs
from qkplast.results import intervention_figures as qf
from tests.unit.stats.test_intervention_readings import synthetic_grid

matplotlib.use("Agg")


def test_cells_draw_each_targeted_condition_at_every_distance_of_every_position():
    grid = synthetic_grid()
    fig = qf.plot_cells(grid, 16)
    assert len(fig.axes) == grid.sizes["position"]
    for ax, p in zip(fig.axes, grid.position.values):
        lines = ax.get_lines()
        assert len(lines) == 5  # none, lowest, highest, both clamps
        lowest = grid.nll.sel(condition=grid.kind == "lowest", position=p).isel(condition=0).mean("window")
        np.testing.assert_allclose(lines[1].get_ydata(), lowest.values)
        np.testing.assert_array_equal(lines[1].get_xdata(), grid.distance.values)


def test_null_figure_puts_each_targeted_set_where_its_null_position_says():
    grid = synthetic_grid()
    fig = qf.plot_null(grid, 16)
    points = [c.get_offsets() for c in fig.axes[0].collections]  # null dots, target, per kind
    for y, kind in enumerate(("lowest", "highest")):
        pos = qs.null_position(grid, kind, 16)
        nulls, target = points[2 * y], points[2 * y + 1]
        np.testing.assert_allclose(nulls[:, 0], pos["null"])
        np.testing.assert_allclose(target[0], [pos["target"], y])


def test_effects_figure_draws_one_interval_per_row_of_the_table():
    table = qs.effect_table(synthetic_grid())
    fig = qf.plot_effects(table)
    ax = fig.axes[0]
    assert len(ax.get_yticklabels()) == len(table)
    bars = [c for c in ax.containers]
    assert len(bars) == len(table)
    for bar, row in zip(bars, table.itertuples()):
        (x,), (y,) = bar.lines[0].get_data()
        assert x == row.effect and row.lo <= x <= row.hi
