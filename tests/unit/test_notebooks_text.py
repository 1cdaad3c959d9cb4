"""The pages' prose keeps the audit's corrections (issue 9): wrong attributions and hard-coded numbers stay out."""

import pytest

from tests.helpers import ROOT

NOTEBOOKS = ROOT / "notebooks"


def text(name: str) -> str:
    return (NOTEBOOKS / f"{name}.py").read_text()


@pytest.mark.parametrize("name, wrong", [
    ("04_rotation", "The thesis reports\n# $7.3"),  # 7.3e-15 is from the author's notes, not the thesis
    ("03_pca", "3,239 heads of 11 models (section 6.1.1)"),  # the head count is 6.1.2 / Fig. A.2
    ("09_results_plasticity", "about 0.07 (Ministral-3)"),  # the thesis gives 0.07-0.08
    ("11_results_benchmark", "For the models with per-length scores"),  # one model: Ministral-3-14B
    ("06_theory", "hundreds to thousands of windows"),  # the start of the bound is printed from the numbers
    ("07_corrections", "hundreds of windows"),
    ("06_theory", "|z| \\le 40"),  # the sharp inequality is proved, not grid-checked on |z| <= 40
])
def test_corrected_claims_stay_out(name, wrong):
    assert wrong not in text(name)


def test_corrections_page_computes_its_verdicts():
    page = text("07_corrections")
    # "confirmed" appears in prose only as the name of a computed word, never as a bold hand-written verdict
    assert "**Confirmed" not in page
    # every verdict is computed against its null (nulls.describe wraps verdict.null_verdict), and the words are
    # decided together at the end, with Holm's correction, by the package
    assert page.count("null_verdict(") + page.count("nulls.describe(") >= 4
    assert "results.corrections_verdicts(readings)" in page and page.count("readings.append(") >= 6


@pytest.mark.parametrize("name", ["07_corrections", "12_interventions", "13_open_questions"])
def test_verdict_pages_state_their_decision_rule_before_the_data(name):
    page = text(name)
    rule = page.find("ecision rule")
    first_data = min(i for i in (page.find("load_or_bootstrap("), page.find("load_or_run_grid("),
                                 page.find("listwise_document_intervals("), page.find("nulls.diagonal_null(")) if i >= 0)
    assert 0 <= rule < first_data, name


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
