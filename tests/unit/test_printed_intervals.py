"""Every interval the book prints stays inside its quantity's range (issue 37).

The committed notebooks' outputs are read as a reader sees them: every HTML table's ``lo``/``hi`` column pairs
(``X lo``/``X hi``, ``95% lo``/``95% hi``), every ``[a, b]`` cell, and every ``[a, b]`` in
printed text. Each is matched to its quantity by the column and row it sits in, and its range comes from the
package's own table of ranges (:data:`qkplast.stats.bootstrap.RANGES`) or the rules below; an interval whose
quantity no rule names fails the test, so a new table must say what it prints. A difference of two values of a
quantity in ``[a, b]`` lies in ``[a - b, b - a]``. The planted pages at the end show that each check can fail.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from bs4 import BeautifulSoup

from qkplast.stats.bootstrap import RANGES
from tests.helpers import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN"
BRACKET = re.compile(rf"\[\s*({NUM})\s*,\s*({NUM})\s*\]")
UNIT, SIGNED, NONNEG, FREE = (0.0, 1.0), (-1.0, 1.0), (0.0, np.inf), (-np.inf, np.inf)


def difference(r: tuple) -> tuple:
    """The range of a difference of two values of a quantity with range ``r``."""
    return (r[0] - r[1], r[1] - r[0])


#: chapter 10's readings: each a difference of one metric between two checkpoints (studies/miniature-readings.yaml)
METRIC_RANGES = {"abs_bias_strength": NONNEG, "ap_first20": UNIT, "ap_drop": SIGNED, "share_position_dominated": UNIT,
                 "abs_r_q_0": UNIT}
MINIATURE = {k: difference(METRIC_RANGES[v["metric"]]) for k, v in
             yaml.safe_load((ROOT / "studies" / "miniature-readings.yaml").read_text())["readings"].items()}

#: brackets that are not intervals, by the column they sit in or the words right before them: lists of buckets or
#: steps, and the prose's statements of a scale's range ("on the logit scale of the [0, 1] aggregates")
NOT_INTERVALS = [r"^buckets", r"scale of the $", r"inside $", r"mapped back into $", r"steps $"]
#: (pattern on "quantity | row label | context", range): the first that matches names the quantity's range
RULES = [
    # chapter 13: GQA's T and its contrast
    (r"^(T|key null|contrast) \|", (-2.0, 2.0)),  # T: a difference of two mean RMS distances of profiles in [0, 1]
    (r"more alike than their shared keys", (-2.0, 2.0)),
    (r"earlier execution's interval", (-2.0, 2.0)),
    (r"^rho \||pairwise AP ranks heads", SIGNED),
    (r"^(model|captured|positional term alone|full scores|equal scores) \|", UNIT),  # listwise AP, nearest mass
    # chapter 12: the unablated model's NLL and accuracy, the effects and readings (differences of NLL or of AP)
    (r"^nll", NONNEG),
    (r"^acc", UNIT),
    (r"^- \| clamp plasticity / ", SIGNED),  # a reading: a contrast of changes of ap_last20
    (r"^- \| (.* / )?(clamp query|clamp key|lowest|highest|selective)( / |$)", FREE),  # effects, readings: of NLL
    # chapter 07's items and its printed readings
    (r"off-axis term, mean over heads", FREE),  # key_position_slope - bias_strength
    (r"^text \| AP_drop ", SIGNED),
    (r"^- \| 11\. AP_drop", SIGNED),
    (r"^- \| 9\. key_position_slope exceeds", FREE),
    (r"^- \| \d+\. ", FREE),
]


#: chapter 13's conditions: a condition's reading is its paired difference to the baseline of a part of AP_drop
#: (the mechanism family reads the content part)
CONDITION = re.compile(r"\b(rope_x[\d.]+|window_\d+|bos|mid_document|mask_first_\d+)\b")


def range_of(label: str):
    """The range of the quantity ``label`` names: from RANGES, the chapter-10 readings or RULES; KeyError if none."""
    if CONDITION.search(label):
        part = re.search(r"ap_drop_\w+", label)
        return difference(RANGES[part.group(0) if part else "ap_drop_content"])
    for name in sorted(RANGES, key=len, reverse=True):  # the longest name first: ap_drop_bias before ap_drop
        if re.search(rf"\b{name}\b", label, re.IGNORECASE):
            r = RANGES[name]
            return FREE if r is None else r
    key = re.search(r"(?:^|\| |-- |; )([PE]\d[ab]?)(?: / |: [+-]?[\d.]+ $|$)", label)  # chapter 10's reading
    if key and key.group(1) in MINIATURE:
        return MINIATURE[key.group(1)]
    for pattern, r in RULES:
        if re.search(pattern, label):
            return r
    raise KeyError(label)


def _rows(table):
    """``(columns, [(index labels, values)])`` of a rendered DataFrame; a row spanned by a multi-index's outer
    label inherits it."""
    head = [[c.get_text(strip=True) for c in tr.find_all(["th", "td"])] for tr in table.find("thead").find_all("tr")]
    n_index = next((i for i, c in enumerate(head[0]) if c != ""), len(head[0])) or 1
    cols = head[0][n_index:]
    out, last = [], [""] * n_index
    for tr in table.find("tbody").find_all("tr"):
        ths = [c.get_text(strip=True) for c in tr.find_all("th")]
        tds = [c.get_text(strip=True) for c in tr.find_all("td")]
        index = (last[: n_index - len(ths)] + ths)[-n_index:]
        last = index
        out.append((index, dict(zip(cols, tds))))
    return cols, out


def intervals(cells):
    """``(cell, label, lo, hi)`` for every interval printed in a notebook's outputs; ``label`` is
    "quantity | row label" for a table, "text | the line before it" for printed text."""
    for i, cell in enumerate(cells):
        for o in cell.get("outputs", []):
            html = "".join(o.get("data", {}).get("text/html", ""))
            for table in BeautifulSoup(html, "html.parser").find_all("table") if "<table" in html else []:
                if table.find("thead") is None:
                    continue
                cols, rows = _rows(table)
                for index, values in rows:  # the row: its index and its words (a kind, a claim, a reading)
                    words = [v for v in values.values() if v and not re.fullmatch(rf"{NUM}|\[.*\]", v)]
                    row = " / ".join([x for x in index if x] + words)
                    for c, v in values.items():
                        m = BRACKET.fullmatch(v)
                        if m:
                            yield i, f"{c} | {row}", m.group(1), m.group(2)
                        lo = re.fullmatch(r"(.*?)\s*\blo", c)
                        if lo and f"{lo.group(1)} hi".strip() in values:
                            quantity = lo.group(1) if lo.group(1) not in ("", "95%") else "-"
                            yield i, f"{quantity} | {row}", v, values[f"{lo.group(1)} hi".strip()]
            if o.get("output_type") == "stream":
                text = "".join(o.get("text", ""))
                for m in BRACKET.finditer(text):
                    yield i, "text | " + text[: m.start()].rsplit("\n", 1)[-1], m.group(1), m.group(2)


def violations(cells) -> list[str]:
    """Every printed interval that is reversed, outside its range, or of a quantity no rule names."""
    bad = []
    for i, label, lo, hi in intervals(cells):
        column, _, before = label.partition(" | ")
        if any(re.search(p, column) or re.search(p, before[-30:]) for p in NOT_INTERVALS):
            continue
        lo, hi = float(lo), float(hi)
        if np.isnan(lo) and np.isnan(hi):
            continue  # undefined, said so in its table
        try:
            a, b = range_of(label)
        except KeyError:
            bad.append(f"cell {i}: no range known for {label!r}: add a rule to this test")
            continue
        if not (a <= lo <= hi <= b):
            bad.append(f"cell {i}: {label!r} prints [{lo}, {hi}] outside its range [{a}, {b}] (or reversed)")
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_printed_interval_is_inside_its_range(path: Path):
    cells = json.loads(path.read_text())["cells"]
    assert not (bad := violations(cells)), "\n".join(bad)


def test_the_book_prints_intervals_this_test_reads():
    """The scanner finds the book's intervals (a parser that finds none would pass every page)."""
    found = {p.stem[:2]: sum(1 for _ in intervals(json.loads(p.read_text())["cells"])) for p in NOTEBOOKS}
    assert all(found[c] >= 5 for c in ("07", "09", "12", "13")), found


def _page(html_rows: str, text: str = "") -> list[dict]:
    table = f"<table><thead>{html_rows.split('|', 1)[0]}</thead><tbody>{html_rows.split('|', 1)[1]}</tbody></table>"
    return [{"cell_type": "code", "outputs": [{"output_type": "execute_result", "data": {"text/html": table}},
                                              {"output_type": "stream", "name": "stdout", "text": text}]}]


def test_planted_pages_fail():
    head = "<tr><th></th><th>rho</th><th>rho lo</th><th>rho hi</th></tr>"
    ok = _page(head + "|<tr><th>8</th><td>0.9</td><td>0.6</td><td>0.99</td></tr>")
    assert violations(ok) == []
    outside = _page(head + "|<tr><th>8</th><td>0.9</td><td>0.6</td><td>1.02</td></tr>")
    assert "outside its range" in violations(outside)[0]
    reversed_ = _page(head + "|<tr><th>8</th><td>0.9</td><td>0.7</td><td>0.6</td></tr>")
    assert "outside its range" in violations(reversed_)[0]
    nll = _page("<tr><th></th><th>nll</th><th>nll 95% CI</th></tr>|<tr><th>32</th><td>0.1</td><td>[-0.05, 0.3]</td></tr>")
    assert "outside its range" in violations(nll)[0]
    unknown = _page("<tr><th></th><th>widgets lo</th><th>widgets hi</th></tr>|<tr><th>a</th><td>0</td><td>1</td></tr>")
    assert "no range known" in violations(unknown)[0]
    text = _page(head + "|", "ap_overall, 95% policy interval over 4 documents [0.93, 1.04]\n")
    assert "outside its range" in violations(text)[0]
