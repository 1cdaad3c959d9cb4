"""Every public name of the README's table ("Where things live") imports from the module its row names, and the
table lists every name a closed issue made a contract."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT

#: Names the README's "Using the package" section and the closed issues fixed as contracts: a module path may
#: change, these names may not, and each keeps a row in the table.
CONTRACT_NAMES = {
    "analyze", "open_capture", "save_capture", "open_dataset", "save_dataset", "validate_capture", "CaptureOptions",
    "AnalysisOptions", "ablate_heads", "clamp_bias", "select_heads", "calibrate_clamp", "calibrate_and_capture",
    "capture_windows", "copy_by_distance", "loss_by_position", "passkey_by_depth", "bootstrap", "load_run",
    "load_or_analyze", "load_or_bootstrap", "load_or_capture", "load_model", "open_corpus", "capture", "run_capture",
    "plan_capture", "run_grid", "capture_conditions", "plasticity", "pca", "rotation", "listwise", "decompose_drop",
    "gqa_similarity", "pooling_table", "planted_capture", "model_rotary", "check_lemma_a1", "check_lemma_a2",
    "check_theorem_4_4", "verdict", "holm", "t_interval", "null_verdict", "prepare_default_model", "write_compare",
}
ROW = re.compile(r"^\| `(?P<name>[A-Za-z_][A-Za-z0-9_]*)` \| `(?P<module>qkplast[a-z0-9_.]*)` \| (?P<moved>[^|]+) \|$")


def readme_table() -> list[tuple[str, str]]:
    """``(name, import from)`` of each row of the table under "### Where things live" in README.md."""
    text = (ROOT / "README.md").read_text()
    assert "### Where things live" in text, "README.md has no 'Where things live' section"
    section = text.split("### Where things live", 1)[1].split("\n#", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| `")]
    rows = [ROW.match(line) for line in lines]
    bad = [line for line, row in zip(lines, rows) if row is None]
    assert not bad, f"rows not of the form | `name` | `qkplast.module` | moved from |: {bad}"
    return [(row["name"], row["module"]) for row in rows]


ROWS = readme_table()


def test_the_table_lists_every_contract_name_once_per_module():
    names = {name for name, _ in ROWS}
    assert not CONTRACT_NAMES - names, f"contract names without a row: {sorted(CONTRACT_NAMES - names)}"
    assert len(set(ROWS)) == len(ROWS), "a row is repeated"


@pytest.mark.parametrize(("name", "module"), ROWS, ids=[f"{m}.{n}" for n, m in ROWS])
def test_the_name_imports_from_its_module(name, module):
    namespace = {}
    exec(f"from {module} import {name}", namespace)  # the statement a user writes, as the table tells them
    # a function or a class, not a module or a constant that happens to share the name
    assert callable(namespace[name]), f"from {module} import {name} gives {namespace[name]!r}"
