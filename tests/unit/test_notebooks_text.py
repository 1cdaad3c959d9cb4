"""What the chapters must say, read from their py:percent sources.

The chapters that decide (07, 10, 12, 13) state their decision rule, or load the registration that holds it,
before the first cell that reads data; they take their words from :mod:`qkplast.stats.decision` (a call of its
functions, or of a package function built on them); and no chapter types a threshold in an ``if`` that picks a
verdict word, nor parses a number back out of formatted text. Each check is a function of a page's text, shown
failing on a planted page beside its test. The audit's corrections (issue 9) are asserted by the sentences that
replaced the wrong ones.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jupytext
import pytest

from qkplast.stats import decision
from tests.helpers import ROOT

NOTEBOOKS = ROOT / "notebooks"
PACKAGE = ROOT / "qkplast"
#: The chapters that decide readings, each with its verdict words.
DECIDING = ("07_corrections", "10_results_training", "12_interventions", "13_open_questions")
#: Calls that read a capture, metrics, a run's settings or trained checkpoints.
DATA_CALLS = {"chapter_run", "load_run", "open_capture", "open_dataset", "run_settings", "checkpoint_metrics",
              "checkpoint_table", "load_full_run", "ensure_training", "capture_conditions"}
#: What loads a registration file, or names the rule inside one.
REGISTRATION_NAMES = {"load_readings", "READINGS_FILE"}
#: Every word a verdict may take: the decision module's, its gate word, and null_verdict's.
VERDICT_WORDS = (*decision.WORDS, decision.NOT_TESTABLE, "confirmed", "not distinguishable")
DECISION_MODULE = "qkplast.stats.decision"


def text(name: str) -> str:
    return (NOTEBOOKS / f"{name}.py").read_text()


def cells(page: str) -> list[tuple[str, str]]:
    """``(cell type, source)`` of each cell of a py:percent page."""
    return [(c.cell_type, c.source) for c in jupytext.reads(page, fmt="py:percent").cells]


def code_trees(page: str) -> list[tuple[int, ast.Module]]:
    """``(cell index, syntax tree)`` of each code cell (IPython magics and shell lines dropped)."""
    out = []
    for i, (kind, source) in enumerate(cells(page)):
        if kind == "code":
            lines = [line for line in source.split("\n") if not line.lstrip().startswith(("%", "!"))]
            out.append((i, ast.parse("\n".join(lines))))
    return out


def called_name(node: ast.Call) -> str | None:
    """``f`` of ``f(...)`` or of ``a.b.f(...)``."""
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)


# --------------------------------------------------------------------------- the rule before the data


def rule_and_data(page: str) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """Where, in reading order ``(cell, line)``, the page first states its decision rule and first reads data.

    The rule is stated by a markdown line naming the "decision rule", or by code loading the registration that
    holds it (``load_readings()``, ``READINGS_FILE``, the key ``"decision_rule"``). Data is read by a call of
    :data:`DATA_CALLS` or of any ``load_or_*`` (a capture, metrics, a bootstrap, a grid).
    """
    rule, data = [], []
    for i, (kind, source) in enumerate(cells(page)):
        if kind == "markdown":
            rule += [(i, n) for n, line in enumerate(source.split("\n"), 1) if re.search("decision rule", line, re.I)]
    for i, tree in code_trees(page):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (called_name(node) in DATA_CALLS
                                               or (called_name(node) or "").startswith("load_or_")):
                data.append((i, node.lineno))
            if ((isinstance(node, ast.Name) and node.id in REGISTRATION_NAMES)
                    or (isinstance(node, ast.Call) and called_name(node) in REGISTRATION_NAMES)
                    or (isinstance(node, ast.Constant) and node.value == "decision_rule")):
                rule.append((i, node.lineno))
    return min(rule, default=None), min(data, default=None)


@pytest.mark.parametrize("name", DECIDING)
def test_deciding_chapters_state_their_rule_before_the_data(name):
    rule, data = rule_and_data(text(name))
    assert data is not None, f"{name}: no data-reading call found (DATA_CALLS is out of date)"
    assert rule is not None, f"{name}: states no decision rule and loads no registration"
    assert rule < data, f"{name}: the decision rule (cell {rule[0]}) comes after the first data read (cell {data[0]})"


PLANTED_RULE_AFTER_DATA = '''# %% [markdown]
# # A chapter

# %%
run = chapter_run(run_dir, globals())

# %% [markdown]
# The decision rule: supported when the interval lies above 0.
'''


def test_rule_check_fails_on_a_planted_rule_after_the_data():
    rule, data = rule_and_data(PLANTED_RULE_AFTER_DATA)
    assert data == (1, 1) and rule == (2, 1) and not rule < data
    moved = PLANTED_RULE_AFTER_DATA.replace("# %%\nrun =", "# %%\nreg = qs.load_readings()\nrun =")
    assert rule_and_data(moved)[0] < rule_and_data(moved)[1]  # a registration loaded first states it
    assert rule_and_data("# %%\nx = 1\n") == (None, None)


# --------------------------------------------------------------------------- verdict words from the package


def module_source(module: str) -> Path | None:
    """The file of a qkplast module, or None outside the package."""
    parts = module.split(".")
    if parts[0] != "qkplast":
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def deciding_functions(module: str) -> set[str]:
    """The functions of ``module`` that call into :mod:`qkplast.stats.decision`, directly or through each other."""
    if module == DECISION_MODULE:
        return {name for name in dir(decision) if callable(getattr(decision, name)) and not name.startswith("_")}
    path = module_source(module)
    if path is None:
        return set()
    tree = ast.parse(path.read_text())
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == DECISION_MODULE for a in node.names}
    imported |= {a.asname or "decision" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == "qkplast.stats" for a in node.names if a.name == "decision"}
    bodies = {f.name: {n.id for n in ast.walk(f) if isinstance(n, ast.Name)} for f in tree.body
              if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = {name for name, used in bodies.items() if used & imported}
    while True:  # a function calling a deciding function of the same module decides too
        more = {name for name, used in bodies.items() if used & found} - found
        if not more:
            return found
        found |= more


def package_decisions(page: str) -> list[str]:
    """The calls of a page that decide through :mod:`qkplast.stats.decision` (a function of it, or a package
    function built on it), as ``module.function``."""
    names, modules = {}, {}  # local name -> (module, function); local alias -> module
    trees = [tree for _, tree in code_trees(page)]
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qkplast"):
                for a in node.names:
                    if module_source(f"{node.module}.{a.name}") is not None:
                        modules[a.asname or a.name] = f"{node.module}.{a.name}"
                    else:
                        names[a.asname or a.name] = (node.module, a.name)
            elif isinstance(node, ast.Import):
                modules.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("qkplast")})
    found = []
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name) and node.func.id in names:
                module, function = names[node.func.id]
            elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id in modules:
                module, function = modules[node.func.value.id], node.func.attr
            else:
                continue
            if function in deciding_functions(module):
                found.append(f"{module}.{function}")
    return found


@pytest.mark.parametrize("name", DECIDING)
def test_deciding_chapters_take_their_words_from_the_decision_module(name):
    assert package_decisions(text(name)), f"{name} decides nothing through qkplast.stats.decision"


def test_decision_check_fails_on_a_planted_page_that_words_its_own_verdicts():
    planted = '''# %%
from qkplast.stats.intervals import t_interval
import numpy as np

lo, hi = t_interval(np.ones(4))[1:]
word = "supported" if lo > 0 else "left open"
'''
    assert package_decisions(planted) == []  # an interval is no decision
    decided = planted.replace('word = "supported" if lo > 0 else "left open"',
                              'from qkplast.stats.decision import verdict\nword = verdict(1.0, lo, hi)')
    assert package_decisions(decided) == ["qkplast.stats.decision.verdict"]
    # a package function built on the decision module counts; one that is not, does not
    assert "qkplast.stats.nulls.describe" in package_decisions("# %%\nfrom qkplast.stats import nulls\nnulls.describe(r, 'x', 'y')\n")
    assert package_decisions("# %%\nfrom qkplast.stats import nulls\nnulls.summary_line(r)\n") == []


# --------------------------------------------------------------------------- no typed thresholds, no parsed numbers


def words_in(node: ast.AST) -> set[str]:
    """The verdict words in the string constants under ``node`` (f-strings included)."""
    strings = [n.value.lower() for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return {w for w in VERDICT_WORDS if any(w in s for s in strings)}


def typed_thresholds(page: str) -> list[str]:
    """Branches that pick a verdict word by comparing with a number typed in the page (``if p < 0.05: "supported"``,
    ``"supported" if lo > 0.1 else ...``, ``np.where(x > 0.5, "supported", ...)``)."""
    def typed(test: ast.AST) -> bool:
        return any(isinstance(n, ast.Compare) and any(isinstance(x, ast.Constant) and isinstance(x.value, float)
                                                      for x in (n.left, *n.comparators)) for n in ast.walk(test))

    found = []
    for i, tree in code_trees(page):
        for node in ast.walk(tree):
            if isinstance(node, (ast.If, ast.IfExp)):
                test, branches = node.test, [node.body, node.orelse]
            elif isinstance(node, ast.Call) and called_name(node) in ("where", "select") and node.args:
                test, branches = node.args[0], node.args[1:]
            else:
                continue
            picked = set().union(*(words_in(b) for branch in branches
                                   for b in (branch if isinstance(branch, list) else [branch])))
            if typed(test) and picked:
                found.append((i, node.lineno, f"cell {i}, line {node.lineno}: {ast.unparse(test)} -> {sorted(picked)}"))
    return [where for *_, where in sorted(found)]  # in reading order


def parsed_numbers(page: str) -> list[str]:
    """``float(...)``/``int(...)`` of text cut out of a string (``float(str(ci).strip("[]").split(",")[0])``)."""
    found = []
    for i, tree in code_trees(page):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and called_name(node) in ("float", "int") and node.args and any(
                    isinstance(n, ast.Call) and called_name(n) in ("split", "strip", "partition", "rsplit")
                    for n in ast.walk(node.args[0])):
                found.append(f"cell {i}, line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.py")), ids=lambda p: p.stem)
def test_no_chapter_types_a_verdict_threshold_or_parses_numbers_from_text(path):
    page = path.read_text()
    assert not typed_thresholds(page), f"{path.name} decides with a typed threshold: {typed_thresholds(page)}"
    assert not parsed_numbers(page), f"{path.name} parses numbers out of text: {parsed_numbers(page)}"


def test_threshold_and_parsing_checks_fail_on_planted_pages():
    planted = '''# %%
word = "supported" if p < 0.05 else "left open"
if coverage >= 0.93:
    status = f"coverage target met: confirmed"
table["verdict"] = np.where(table.lo > 0.0, "supported", "no effect")
lo = float(str(r["rho 95% CI"]).strip("[]").split(",")[0])
'''
    assert [f.split(":")[0] for f in typed_thresholds(planted)] == ["cell 0, line 1", "cell 0, line 2", "cell 0, line 4"]
    assert parsed_numbers(planted) == ['cell 0, line 5: float(str(r[\'rho 95% CI\']).strip(\'[]\').split(\',\')[0])']
    # a rounding check or a format choice is no verdict; a package-decided word is no typed threshold
    clean = '''# %%
print(f"identity holds: {err < 1e-12}")
label = f"{v:.3g}" if abs(v) > 1e-12 else "< 1e-12"
word = verdict(est, lo, hi, p)
'''
    assert typed_thresholds(clean) == [] and parsed_numbers(clean) == []


# --------------------------------------------------------------------------- what chapter 07 computes


def test_corrections_page_computes_its_verdicts():
    page = text("07_corrections")
    # every verdict is computed against its null (nulls.describe wraps decision.null_verdict), and the words are
    # decided together at the end, with Holm's correction, by the package (in qkplast.results.tables as
    # corrections_verdicts, or in qkplast.stats.decision under a name of its own)
    assert page.count("null_verdict(") + page.count("nulls.describe(") >= 4
    assert re.search(r"\b(?:corrections|holm)_verdicts\(readings\)", page), "07 no longer decides its readings together"
    assert page.count("readings.append(") >= 6


# --------------------------------------------------------------------------- the audit's corrections (issue 9)


@pytest.mark.parametrize("name, said", [
    # the residual 7.3e-15 is from the author's notes, not the thesis
    ("04_rotation", "the residual of $7.3\\times10^{-15}$ comes from the author's"),
    # the head count is given in 6.1.2 / Fig. A.2, not 6.1.1
    ("03_pca", "the head count, 3,239, is given with the bias-strength\n# results, section 6.1.2 and Fig. A.2"),
    ("09_results_plasticity", "0.07-0.08 (Ministral-3)"),  # the thesis gives a range
    ("11_results_benchmark", "One model has per-length scores, Ministral-3-14B"),  # one model, not "the models"
    # where the bound starts is printed from the numbers, not typed ("hundreds to thousands of windows")
    ("06_theory", 'print(f"the bound starts at T = {start[\'median\']:,.0f} window lengths'),
    ("07_corrections", 'print(f"bound start T in window lengths: median {start[\'median\']:,.0f}'),
    # the sharp inequality is proved (a lemma with its proof) and checked, not grid-checked on |z| <= 40 only
    ("06_theory", "{prf:ref}`lemma-sharp`"),
])
def test_the_corrected_claims_are_stated(name, said):
    assert said in text(name)


def test_interventions_page_does_not_claim_a_closed_chain_or_cite_what_it_does_not_run():
    page = text("12_interventions")
    assert "closes the chain" not in page.lower()
    assert "loss_by_position" not in page and "passkey_by_depth" not in page
    assert "not a bias-only edit" in page  # the query clamp


def test_theorem_is_stated_for_a_fixed_pair_set_and_the_population_rate_is_shown():
    page = text("06_theory")
    assert "fixed pair set" in page and "prop-population-rate" in page and "check_population_rate()" in page


def test_results_pages_use_1000_replicates():
    for name in ("08_results_geometry", "09_results_plasticity"):
        assert "\nn_boot = 1000 " in text(name), name
