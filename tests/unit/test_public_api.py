"""Every public name of the book's API reference (book/package.md) imports from the module its section names, and
the page lists every name a closed issue made a contract."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT

#: Names the README's quickstart and the closed issues fixed as contracts: a module path may change, these names
#: may not, and each keeps an entry in the API reference.
CONTRACT_NAMES = {
    "analyze", "open_capture", "save_capture", "open_dataset", "save_dataset", "validate_capture", "CaptureOptions",
    "AnalysisOptions", "ablate_heads", "clamp_bias", "select_heads", "calibrate_clamp", "calibrate_and_capture",
    "capture_windows", "copy_by_distance", "loss_by_position", "passkey_by_depth", "bootstrap", "load_run",
    "load_or_analyze", "load_or_bootstrap", "load_or_capture", "load_model", "open_corpus", "capture", "run_capture",
    "plan_capture", "run_grid", "capture_conditions", "plasticity", "pca", "rotation", "listwise", "decompose_drop",
    "gqa_similarity", "pooling_table", "planted_capture", "model_rotary", "check_lemma_a1", "check_lemma_a2",
    "check_theorem_4_4", "verdict", "holm", "t_interval", "null_verdict", "prepare_default_model", "write_compare",
}
#: One module's block of book/package.md: its autosummary table, then its autodoc entries.
BLOCK = re.compile(r"\.\. currentmodule:: (?P<module>qkplast[a-z0-9_.]*)\n\n\.\. autosummary::\n\n(?P<table>(?:   \w+\n)+)"
                   r"\n\.\. automodule:: (?P<documented>\S+)\n   :members: (?P<members>[^\n]+)\n")


def package_page_names() -> list[tuple[str, str]]:
    """``(name, import from)`` of each entry of the API reference in book/package.md, in page order."""
    text = (ROOT / "book" / "package.md").read_text()
    blocks = list(BLOCK.finditer(text))
    assert blocks, "book/package.md has no API reference (currentmodule, autosummary, automodule blocks)"
    assert len(blocks) == text.count(".. automodule::"), "an automodule block of book/package.md is not of the form read here"
    rows = []
    for block in blocks:
        table = block["table"].split()
        members = [name.strip() for name in block["members"].split(",")]
        # the table a reader scans and the entries autodoc writes must name the same things
        assert block["documented"] == block["module"], f"automodule {block['documented']} under currentmodule {block['module']}"
        assert table == members, f"{block['module']}: autosummary {table} != automodule members {members}"
        rows += [(name, block["module"]) for name in table]
    return rows


ROWS = package_page_names()


def test_the_page_lists_every_contract_name_once_per_module():
    names = {name for name, _ in ROWS}
    assert not CONTRACT_NAMES - names, f"contract names without an entry in book/package.md: {sorted(CONTRACT_NAMES - names)}"
    assert len(set(ROWS)) == len(ROWS), "an entry is repeated"


@pytest.mark.parametrize(("name", "module"), ROWS, ids=[f"{m}.{n}" for n, m in ROWS])
def test_the_name_imports_from_its_module(name, module):
    namespace = {}
    exec(f"from {module} import {name}", namespace)  # the statement a user writes, as the page tells them
    # a function or a class, not a module or a constant that happens to share the name
    assert callable(namespace[name]), f"from {module} import {name} gives {namespace[name]!r}"
