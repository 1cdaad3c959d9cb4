"""Figures of the book, one function per figure; each returns a matplotlib Figure.

They read the labelled outputs of :mod:`qkplast` (captures, metrics,
pair statistics), so a notebook cell is one call.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

from qkplast.analysis.schema import TAXONOMY
from qkplast.theory.checks import lemma_a2_constants, pp_from_z

Q_COLOR, K_COLOR = "tab:blue", "tab:red"


def _fig(ncols=1, width=6.4, height=4.0):
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols if ncols > 1 else width, height), squeeze=False,
                             layout="constrained")
    return fig, axes[0]


def rope_frequencies(table, lengths: dict[str, int]):
    """Wavelength of every rotation pair, against the context lengths in ``lengths`` (label -> tokens)."""
    fig, (ax,) = _fig()
    ax.semilogy(table.index, table["wavelength_tokens"], "o-", ms=3, color="k")
    for (label, n), style in zip(lengths.items(), ("--", ":", "-.")):
        ax.axhline(n, ls=style, color="tab:orange", label=f"{label} ({n:,} tokens)")
    ax.set(xlabel="rotation pair k", ylabel="wavelength 2π/θ_k (tokens)",
           title="RoPE frequencies: fast pairs turn many times, slow pairs less than once")
    ax.legend()
    return fig


def sampling_coverage(capture: xr.Dataset):
    """Sampled positions per bucket and document (section 4.1.2)."""
    docs = np.unique(capture.doc.values)
    n_bucket = int(np.ceil(capture.attrs["seq_len"] / capture.attrs["bucket_size"]))
    counts = np.zeros((len(docs), n_bucket), int)
    di = np.searchsorted(docs, capture.doc.values)
    np.add.at(counts, (di, capture.bucket.values), 1)
    fig, (a1, a2) = _fig(2, width=5.2)
    a1.bar(np.arange(n_bucket), counts.sum(0), color="0.4")
    a1.set(xlabel="position bucket", ylabel="sampled positions", title="samples per bucket (all documents)")
    im = a2.imshow(counts, aspect="auto", cmap="Greys", interpolation="nearest")
    a2.set(xlabel="position bucket", ylabel="document window", title="samples per bucket and document")
    fig.colorbar(im, ax=a2)
    return fig


def pc_correlations(metrics: xr.Dataset, n_pc: int = 10):
    """Mean ``|r_q|``, ``|r_k|`` with position and explained variance per principal component (cf. Fig. 6.1)."""
    m = metrics.isel(pc=slice(0, n_pc))
    fig, (ax,) = _fig()
    x = np.arange(m.sizes["pc"])
    ax.bar(x - 0.2, abs(m.r_q_pc).mean("head"), 0.4, color=Q_COLOR, label="|r_q| (queries)")
    ax.bar(x + 0.2, abs(m.r_k_pc).mean("head"), 0.4, color=K_COLOR, label="|r_k| (keys)")
    ax2 = ax.twinx()
    ax2.plot(x, m.explained_variance_ratio.mean("head"), "k.-", label="explained variance")
    ax.set(xlabel="principal component", ylabel="mean |Pearson r| with position", ylim=(0, 1))
    ax2.set(ylabel="mean explained variance ratio")
    ax.legend(loc="upper right")
    ax2.legend(loc="center right")
    ax.set_title("position correlation per principal component")
    return fig


def taxonomy_scatter(metrics: xr.Dataset, low: float = 0.3, high: float = 0.7):
    """Heads in (``|r_q^(0)|``, ``|r_k^(0)|``) space with the taxonomy thresholds (cf. Fig. A.1)."""
    fig, (ax,) = _fig(width=5.2, height=5.0)
    rq, rk = abs(metrics.r_q_pc[:, 0]), abs(metrics.r_k_pc[:, 0])
    for name, color in zip(TAXONOMY, ("tab:purple", "tab:blue", "tab:green", "0.6")):
        sel = metrics.taxonomy == name
        ax.scatter(rq[sel], rk[sel], s=12, color=color, label=f"{name} ({int(sel.sum())})")
    for v in (low, high):
        ax.axvline(v, ls="--", color="k", lw=0.8)
        ax.axhline(v, ls="--", color="k", lw=0.8)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="|r_q| on PC0", ylabel="|r_k| on PC0", title="head taxonomy")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def axis_reversal(metrics: xr.Dataset):
    """Mean ``|r_q|`` and ``|r_k|`` on PC0 and on the drift axis a: the Q/K order reverses (cf. Figs. 6.1-6.2)."""
    fig, (ax,) = _fig(width=5.0)
    vals = [abs(metrics.r_q_pc[:, 0]).mean(), abs(metrics.r_k_pc[:, 0]).mean(), abs(metrics.r_q_a).mean(),
            abs(metrics.r_k_a).mean()]
    ax.bar([0, 1, 3, 4], [float(v) for v in vals], color=[Q_COLOR, K_COLOR, Q_COLOR, K_COLOR])
    ax.set_xticks([0, 1, 3, 4], ["q, PC0", "k, PC0", "q, axis a", "k, axis a"])
    ax.set(ylabel="mean |Pearson r| with position", ylim=(0, 1), title="PC0 versus the drift axis")
    return fig


def ab_plane(capture: xr.Dataset, metrics: xr.Dataset, head: int):
    """Queries and keys of one head projected on the {a, b} plane, coloured by position."""
    a, b = metrics.axis_a.values[head], metrics.axis_b.values[head]
    fig, (ax,) = _fig(width=6.0, height=4.6)
    pos = capture.position.values
    for name, marker in (("q", "o"), ("k", "^")):
        x = capture[name].values[head].astype(float)
        sc = ax.scatter(x @ a, x @ b, c=pos, s=10, marker=marker, cmap="viridis", label=name)
    fig.colorbar(sc, ax=ax, label="token position")
    h = metrics.isel(head=head)
    ax.set(xlabel="projection on a (drift axis)", ylabel="projection on b (separation axis)",
           title=f"layer {int(h.layer)}, q_head {int(h.q_head)}: bias_strength {float(h.bias_strength):.3g}")
    ax.legend()
    return fig


def bias_distribution(metrics: xr.Dataset):
    """Histogram of bias_strength = mu_Q^a alpha_K (cf. Fig. A.2)."""
    fig, (ax,) = _fig()
    ax.hist(metrics.bias_strength, bins=40, color="0.4")
    ax.axvline(0, color="k", lw=0.8)
    share = float((metrics.bias_strength > 0).mean())
    ax.set(xlabel="bias_strength (score units per token)", ylabel="heads",
           title=f"bias strength: {100 * share:.1f}% of heads positive")
    return fig


def bias_vs_separation(metrics: xr.Dataset):
    """bias_strength against separation_strength per head, by layer (cf. Fig. A.3)."""
    fig, (ax,) = _fig()
    sc = ax.scatter(metrics.separation_strength, metrics.bias_strength, c=metrics.layer, s=10, cmap="viridis")
    fig.colorbar(sc, ax=ax, label="layer")
    r = np.corrcoef(metrics.separation_strength, metrics.bias_strength)[0, 1]
    ax.set(xlabel="separation_strength (mu_Q - mu_K)^T b", ylabel="bias_strength", title=f"Pearson r = {r:.2f}")
    return fig


def plasticity_profile(metrics: xr.Dataset):
    """Per-head plasticity profiles, their mean, and the Monte Carlo mean (cf. Fig. 6.4)."""
    fig, (ax,) = _fig()
    tau = metrics.tau.values
    for h in range(metrics.sizes["head"]):
        ax.plot(tau, metrics.ap.values[h], color="0.7", lw=0.4, alpha=0.5)
    ax.plot(tau, metrics.ap.mean("head"), "k-o", ms=3, label="closed form, mean over heads")
    ax.plot(tau, metrics.ap_mc.mean("head"), "--s", color="tab:orange", ms=3, label="Monte Carlo, mean over heads")
    ax.set(xlabel="query position tau (tokens)", ylabel="attention plasticity AP", ylim=(0, 1),
           title="plasticity profile")
    ax.legend()
    return fig


def plasticity_map(metrics: xr.Dataset, variable: str = "ap_map"):
    """Mean plasticity over heads by inter-key distance and query-to-key-midpoint distance (cf. Fig. 6.3)."""
    fig, (ax,) = _fig(width=6.0, height=4.8)
    m = metrics[variable].mean("head")
    kd, qd = metrics.key_distance.values, metrics.query_distance.values
    step = kd[1] - kd[0]
    im = ax.imshow(m.values.T, origin="lower", aspect="auto", cmap="magma", vmin=0, vmax=1,
                   extent=(kd[0] - step / 2, kd[-1] + step / 2, qd[0] - step / 2, qd[-1] + step / 2))
    fig.colorbar(im, ax=ax, label="mean plasticity")
    ax.set(xlabel="inter-key distance |t_i - t_j| (tokens)", ylabel="query to key-midpoint distance (tokens)",
           title="plasticity over the two distances")
    return fig


def closed_vs_monte_carlo(metrics: xr.Dataset):
    """Closed-form against Monte Carlo plasticity per (head, query bucket)."""
    fig, (ax,) = _fig(width=5.0, height=5.0)
    a, b = metrics.ap.values.ravel(), metrics.ap_mc.values.ravel()
    ok = ~np.isnan(a) & ~np.isnan(b)
    ax.scatter(b[ok], a[ok], s=4, alpha=0.4, color="0.3")
    ax.plot([0, 1], [0, 1], "r--", lw=1)
    ax.set(xlabel="Monte Carlo AP (captured queries)", ylabel="Gaussian closed-form AP", xlim=(0, 1), ylim=(0, 1),
           title=f"per head and bucket: mean |difference| {np.mean(np.abs(a[ok] - b[ok])):.3f}")
    return fig


def lemma_a2_pairs(stats: xr.Dataset, head: int = 0, n_pairs: int = 6, t_max: float | None = None, seed: int = 0):
    """PP(t) of real key pairs against the explicit Lemma A.2 bound, from :func:`qkplast.analysis.plasticity.pair_statistics`.

    For each pair, ``z(t) = gamma t + z0`` with the pair's fitted gamma and z0;
    the bound ``C0 exp(-gamma^2 t^2 / 8)`` (sharp constants) is drawn from its T0 on.
    """
    s = stats.isel(head=head)
    g, z0 = s.gamma.values.ravel(), s.z0.values.ravel()
    ok = np.flatnonzero(~np.isnan(g) & (g != 0))
    pick = np.random.default_rng(seed).choice(ok, size=min(n_pairs, ok.size), replace=False)
    t_max = t_max or 4 * float(stats.tau.max())
    t = np.linspace(0, t_max, 800)
    fig, (ax,) = _fig()
    c0, t0 = lemma_a2_constants(g[pick], z0[pick], route="sharp")
    for n, p in enumerate(pick):
        color = plt.cm.tab10(n)
        ax.plot(t, pp_from_z(g[p] * t + z0[p]), color=color)
        tb = t[t >= t0[n]]
        ax.plot(tb, c0[n] * np.exp(-g[p] ** 2 * tb**2 / 8), "--", color=color)
    ax.axvline(float(stats.tau.max()), color="k", lw=0.8, ls=":", label="end of the captured context")
    ax.set(xlabel="query position t (tokens)", ylabel="pairwise plasticity", ylim=(0, 1.05),
           title="PP(t) (solid) and the Lemma A.2 bound from T0 on (dashed)")
    ax.legend()
    return fig


def quintile_profiles(table):
    """Quintile profiles of :func:`qkplast.results.tables.quintile_table`: thesis models thin, this project's runs bold."""
    fig, (ax,) = _fig(width=7.0, height=4.4)
    x = np.arange(5)
    colors = {"Ministral-3": "tab:green", "Qwen-3": "tab:purple", "Llama-3.2": "tab:orange"}
    for (group, model), row in table.iterrows():
        values = row.iloc[:5].to_numpy(float)
        if group.startswith("thesis"):
            family = group.removeprefix("thesis: ")
            ax.plot(x, values, "-", lw=1, alpha=0.7, color=colors.get(family, "0.5"),
                    label=family if model == table.loc[group].index[0] else None)
        else:
            ax.plot(x, values, "k-o", lw=2.5, label=f"{model} ({group.removeprefix('this project ')})")
    ax.set_xticks(x, list(table.columns[:5]))
    ax.set(xlabel="query position (share of the context window)", ylabel="mean attention plasticity",
           title="plasticity by fifth of the context (Table 6.1 layout)")
    ax.legend(fontsize=8)
    return fig


def trajectory(table, title: str = "SmolLM3-3B checkpoints (thesis Table 6.2)"):
    """Bias and plasticity across checkpoints (cf. Figs. 6.5-6.6) from a Table 6.2-shaped table."""
    fig, (a1, a2) = _fig(2, width=5.6)
    x = np.arange(len(table))
    a1.plot(x, table["bias_str"], "k-o", label="bias_strength")
    a1b = a1.twinx()
    a1b.plot(x, table["|alpha_K|"], "--s", color="tab:red", label="|alpha_K|")
    a1.set(ylabel="bias_strength", title="bias collapses in long-context training")
    a1b.set_ylabel("|alpha_K|")
    for col, style in (("AP_overall", "-o"), ("AP_first20", "-s"), ("AP_drop", "--^")):
        a2.plot(x, table[col], style, label=col)
    a2.set(ylabel="plasticity", title="near plasticity recovers, AP_drop grows")
    for ax in (a1, a2):
        ax.set_xticks(x, list(table.index), rotation=60, ha="right", fontsize=7)
    a1.legend(loc="upper left", fontsize=8)
    a1b.legend(loc="upper right", fontsize=8)
    a2.legend(fontsize=8)
    fig.suptitle(title)
    return fig


def benchmark_scatter(longbench, runs: dict[str, float] | None = None):
    """AP_drop against the LongBench-Pro score (cf. Fig. 6.7); this project's AP_drop as vertical lines."""
    fig, (ax,) = _fig(width=6.4, height=4.6)
    colors = {"Ministral-3": "tab:green", "Qwen-3": "tab:purple", "Llama-3.2": "tab:orange"}
    for family, g in longbench.groupby("family"):
        ax.scatter(g.ap_drop, g.lbp_score, s=40, color=colors.get(family, "0.4"), label=family)
        for _, r in g.iterrows():
            ax.annotate(r.model.split("-")[-1], (r.ap_drop, r.lbp_score), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    for name, drop in (runs or {}).items():
        ax.axvline(drop, color="k", ls=":", lw=1)
        ax.annotate(f"{name}: AP_drop {drop:.3f}\n(no LongBench-Pro score)", (drop, ax.get_ylim()[0]),
                    fontsize=7, rotation=90, va="bottom", ha="right")
    ax.set(xlabel="AP_drop (first minus last fifth)", ylabel="LongBench-Pro score",
           title="plasticity drop against LongBench-Pro (thesis Table 6.3)")
    ax.legend(fontsize=8)
    return fig
