"""The thesis's reported figures, as tidy tables.

The CSV files under ``data/thesis/`` transcribe the numbers printed in the thesis
(Tables 5.1, 5.2, 6.1-6.4 and A.1, plus the scalar facts quoted in the text of
chapters 5-7). Every row carries its provenance in the ``source`` and ``section``
columns; ``data/thesis/README.md`` documents columns and units. This module only
reads them: nothing here is computed from captures.

Examples
--------
>>> from qkplast.results import reference
>>> reference.available()[:3]
['bibliography_keys', 'longbench_matched', 'longbench_per_length']
>>> reference.scalar("taxonomy_mixed")
55.4
>>> reference.scalar_range("ab_plane_variance_share")
(30.0, 43.0)
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import pandas as pd
import xarray as xr

from qkplast.resources import resource_dir

__all__ = [
    "DATA_DIR", "ReferenceDataError", "available", "citation_key", "data_dir", "load", "longbench",
    "quintile_profiles", "scalar", "scalar_range",
]

#: Where the transcribed tables live: ``<repository>/data/thesis``, or the copy an installed wheel ships.
DATA_DIR = resource_dir("data/thesis")


class ReferenceDataError(FileNotFoundError):
    """The ``data/thesis`` directory or one of its files is missing."""


def data_dir() -> Path:
    """Return the directory holding the thesis tables.

    Returns
    -------
    pathlib.Path
        ``data/thesis`` of the checkout, or the wheel's copy (:func:`qkplast.resources.resource_dir`).

    Raises
    ------
    ReferenceDataError
        If the directory does not exist (a wheel built without its shipped copy).
    """
    path = Path(DATA_DIR)
    if not path.is_dir():
        raise ReferenceDataError(
            f"thesis reference data not found: {path} does not exist. The tables ship with the "
            "qkplast repository (data/thesis/) and inside a wheel built by its setup.py; reinstall from "
            "the repository (pip install .) or run from a checkout."
        )
    return path


def available() -> list[str]:
    """List the names accepted by :func:`load`.

    Returns
    -------
    list of str
        The stems of the CSV files in ``data/thesis``, sorted.
    """
    return sorted(p.stem for p in data_dir().glob("*.csv"))


@lru_cache(maxsize=None)
def _read(path: str, mtime_ns: int) -> pd.DataFrame:
    # ``mtime_ns`` is only part of the cache key, so an edited file is read again.
    return pd.read_csv(path, encoding="utf-8", keep_default_na=False, na_values=["", "—"])


def load(name: str) -> pd.DataFrame:
    """Load one thesis table by name.

    Parameters
    ----------
    name : str
        File stem in ``data/thesis``: ``"models"`` (Table 5.1),
        ``"smollm3_checkpoints"`` (Table 5.2), ``"quintile_plasticity"``
        (Table 6.1, long format), ``"smollm3_trajectory"`` (Table 6.2),
        ``"longbench_matched"`` (Table 6.3), ``"longbench_per_length"``
        (Table 6.4), ``"smollm3_lc_per_position"`` (Table A.1, long format),
        ``"scalar_facts"`` (numbers quoted in the text) or
        ``"bibliography_keys"`` (thesis reference number to BibTeX key).

    Returns
    -------
    pandas.DataFrame
        A fresh copy; missing entries (printed as "—" in the thesis) are NaN.

    Raises
    ------
    KeyError
        If ``name`` is not one of :func:`available`; the message lists them.
    ReferenceDataError
        If the data directory is missing.
    """
    names = available()
    if name not in names:
        raise KeyError(f"unknown thesis table {name!r}; available: {', '.join(names)}")
    path = data_dir() / f"{name}.csv"
    return _read(str(path), path.stat().st_mtime_ns).copy()


def quintile_profiles() -> xr.DataArray:
    """Quintile plasticity profiles of the 11 primary models (thesis Table 6.1, section 6.2.1).

    Returns
    -------
    xarray.DataArray
        Mean attention plasticity, dims ``(model, quintile)`` with quintile
        0..4 covering context fractions ``[lo, hi)``. Coordinates: ``family``
        and ``params`` (billions of parameters) along ``model``; ``lo`` and
        ``hi`` along ``quintile``; ``ap_drop`` (as printed in Table 6.1) along
        ``model``. Models keep the table's order.
    """
    df = load("quintile_plasticity")
    models = list(dict.fromkeys(df["model"]))
    wide = df.pivot(index="model", columns="quintile", values="ap").loc[models]
    per_model = df.drop_duplicates("model").set_index("model").loc[models]
    per_q = df.drop_duplicates("quintile").set_index("quintile").loc[wide.columns]
    return xr.DataArray(
        wide.to_numpy(dtype=float),
        dims=("model", "quintile"),
        coords={
            "model": models,
            "quintile": wide.columns.to_numpy(),
            "family": ("model", per_model["family"].to_numpy()),
            "params": ("model", per_model["params_b"].to_numpy(dtype=float), {"units": "1e9 parameters"}),
            "ap_drop": ("model", per_model["ap_drop"].to_numpy(dtype=float)),
            "lo": ("quintile", per_q["lo"].to_numpy(dtype=float), {"units": "fraction of context window"}),
            "hi": ("quintile", per_q["hi"].to_numpy(dtype=float), {"units": "fraction of context window"}),
        },
        name="ap",
        attrs={"long_name": "mean attention plasticity", "units": "probability", "source": "Table 6.1",
               "section": "6.2.1"},
    )


def _fact(name: str) -> pd.Series:
    facts = load("scalar_facts").set_index("name")
    if name not in facts.index:
        raise KeyError(f"unknown scalar fact {name!r}; available: {', '.join(facts.index)}")
    return facts.loc[name]


def scalar(name: str) -> float:
    """A point value quoted in the thesis text (``data/thesis/scalar_facts.csv``).

    Parameters
    ----------
    name : str
        Row name, e.g. ``"pca_pc0_variance_share"`` (section 6.1.1) or
        ``"n_primacy_heads"`` (section 6.1.2).

    Returns
    -------
    float
        The value as printed, in the row's ``unit`` (percentages stay in
        percent: 34.0 means 34 %).

    Raises
    ------
    KeyError
        Unknown name; the message lists the known ones.
    ValueError
        The thesis gives only a range for this quantity; use :func:`scalar_range`.
    """
    row = _fact(name)
    if pd.isna(row["value"]):
        raise ValueError(f"{name!r} is reported as a range ({row['low']}-{row['high']}), not a value; "
                         "use scalar_range()")
    return float(row["value"])


def scalar_range(name: str) -> tuple[float, float]:
    """The ``(low, high)`` bounds of a quantity quoted in the thesis text.

    Parameters
    ----------
    name : str
        Row name in ``data/thesis/scalar_facts.csv``, e.g.
        ``"bias_strength_mean_qwen3"`` (section 6.1.2).

    Returns
    -------
    tuple of float
        The printed range. A point value gives ``(value, value)``; a one-sided
        bound gives NaN on the open side (``"ap_drop_target"``: ``(nan, 0.1)``).

    Raises
    ------
    KeyError
        Unknown name; the message lists the known ones.
    """
    row = _fact(name)
    low, high, value = (float(row[c]) if not pd.isna(row[c]) else math.nan for c in ("low", "high", "value"))
    if math.isnan(low) and math.isnan(high):
        return (value, value)
    return (low, high)


def longbench() -> pd.DataFrame:
    """The 7 models matched to LongBench-Pro, with their plasticity profile and configuration.

    Table 6.3 (section 6.4.1), in its printed order (LongBench-Pro score,
    descending), joined on ``model`` with the quintile profile of Table 6.1
    (columns ``ap_q0`` .. ``ap_q4``) and the configuration of Table 5.1
    (``params_b``, ``n_layers``, ``n_q_heads``, ``head_dim``, ``context_tokens``,
    ``pos_enc``).

    Returns
    -------
    pandas.DataFrame
        Indexed by ``model``; the provenance columns of Table 6.3 are kept.
    """
    lbp = load("longbench_matched")
    q = load("quintile_plasticity").pivot(index="model", columns="quintile", values="ap")
    q.columns = [f"ap_q{int(c)}" for c in q.columns]
    cfg = load("models")[["model", "params_b", "n_layers", "n_q_heads", "head_dim", "context_tokens", "pos_enc"]]
    out = lbp.merge(q, left_on="model", right_index=True, how="left", validate="one_to_one")
    out = out.merge(cfg, on="model", how="left", validate="one_to_one")
    missing = out.loc[out[["ap_q0", "params_b"]].isna().any(axis=1), "model"].tolist()
    if missing:
        raise ReferenceDataError(f"Table 6.3 models missing from Table 6.1 or 5.1: {missing}")
    return out.set_index("model")


def citation_key(number: int) -> str:
    """BibTeX key in ``book/references.bib`` of the thesis's reference ``[number]``.

    Parameters
    ----------
    number : int
        1..45, as printed in the thesis's Bibliography.

    Returns
    -------
    str
        For example ``citation_key(34) == "su2024roformer"``.
    """
    keys = load("bibliography_keys").set_index("number")["key"]
    if number not in keys.index:
        raise KeyError(f"the thesis has no reference [{number}]; it numbers {keys.index.min()}..{keys.index.max()}")
    return str(keys.loc[number])


def table_a1_in_first_bucket() -> pd.DataFrame:
    """Table A.1 entries whose position bin lies inside the first position bucket of their phase.

    Under section 4.4.5 only keys of *earlier* buckets are eligible, so a query in the first bucket
    (``[0, bucket_size)``, bucket sizes from the text after Table 5.2) has no key pairs and no
    plasticity; yet Table A.1 prints values there. Returns those rows with the bucket size in tokens.
    """
    a1 = load("smollm3_lc_per_position")
    size = load("smollm3_checkpoints").set_index("checkpoint").bucket_size_tokens
    a1 = a1.assign(bucket_size_tokens=a1.checkpoint.map(size).astype(int))
    inside = (a1.hi_k * 1024 <= a1.bucket_size_tokens) & a1.ap.notna()
    return a1.loc[inside, ["checkpoint", "label", "bin_label", "lo_k", "hi_k", "bucket_size_tokens", "ap"]]


def head_shortfall_hypothesis(n_layers: int, n_q_heads: int, n_excluded_layers: int, n_sampled: int = 300,
                              shortfall: int | None = None) -> dict:
    """If the sampled heads that fall in excluded layers were dropped, how many would be missing?

    Heads are drawn uniformly without replacement (section 5.4.1), so the number in the excluded
    layers is hypergeometric. Returns its mean, standard deviation, a central 90% range and, for an
    observed ``shortfall`` (e.g. 3,300 - 3,239 = 61), the two-sided tail probability of a value at
    least that far from the mean. A hypothesis check, not a proof of what the thesis did.
    """
    from scipy import stats

    total, bad = n_layers * n_q_heads, n_excluded_layers * n_q_heads
    if not 0 < n_sampled <= total or not 0 <= bad <= total:
        raise ValueError(f"need 0 < n_sampled <= n_layers * n_q_heads = {total} and 0 <= excluded heads <= {total}")
    dist = stats.hypergeom(total, bad, n_sampled)
    out = {"heads": total, "excluded_heads": bad, "mean": float(dist.mean()), "sd": float(dist.std()),
           "range_90": (int(dist.ppf(0.05)), int(dist.ppf(0.95)))}
    if shortfall is not None:
        dev = abs(shortfall - dist.mean())
        out["shortfall"] = shortfall
        out["p_two_sided"] = float(min(1.0, dist.cdf(math.floor(dist.mean() - dev)) + dist.sf(math.ceil(dist.mean() + dev) - 1)))
    return out
