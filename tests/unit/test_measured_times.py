"""The measured-times page (benchmarks/measured_times.py): the table in book/reproduce.md and the README's sentence
are what the data renders, one row per setting with the latest measurement, and the parts a measurement reads (pytest's closing line, the run
manifest's notebook times, /proc/cpuinfo) are read as written."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import measured_times  # noqa: E402


def test_the_book_page_holds_the_table_the_data_renders():
    page = (ROOT / "book" / "reproduce.md").read_text()
    assert page == measured_times.render_page(), (
        "book/reproduce.md's measured-times table differs from data/measured_times.csv: "
        "run `python benchmarks/measured_times.py --render-only`")
    rows = measured_times.read_rows()
    assert rows, "data/measured_times.csv has no measurement"
    assert len({(row["cpu"], row["commands"]) for row in rows}) == len(rows), "a setting has more than one row"
    for row in rows:
        assert measured_times.minutes(row["book_s"]) in page and measured_times.minutes(row["test_s"]) in page and f"`{row['commit']}`" in page


def test_the_readme_holds_the_sentence_the_data_renders():
    readme = (ROOT / "README.md").read_text()
    assert readme == measured_times.render_readme(), (
        "README.md's sentence of measured times differs from data/measured_times.csv: "
        "run `python benchmarks/measured_times.py --render-only`")


def test_the_readme_sentence_is_the_latest_row_of_the_readmes_order():
    base = {field: "" for field in measured_times.FIELDS} | {"cpu": "AMD EPYC", "cores": "2", "tests": "3 passed"}
    rows = [base | {"commands": measured_times.COMMANDS, "commit": "new", "date": "2026-11-28", "book_s": "1763",
                    "test_s": "2346", "note": "test.sh exited 1"},
            base | {"commands": measured_times.COMMANDS, "commit": "old", "date": "2026-11-27", "book_s": "60", "test_s": "60"},
            base | {"commands": "each alone", "commit": "other", "date": "2026-11-29", "book_s": "1", "test_s": "1"}]
    assert measured_times.readme_sentence(rows) == (
        "Measured on a 2-core AMD EPYC, `book.sh` then `test.sh` in one fresh clone (commit `new`, 2026-11-28): "
        "`book.sh` **29 min 23 s**, `test.sh` **39 min 6 s** (3 passed; test.sh exited 1).")
    with pytest.raises(ValueError, match="no row of"):
        measured_times.readme_sentence(rows[2:])
    alone = base | {"commands": measured_times.ALONE, "commit": "ci", "date": "2026-11-29", "book_s": "",
                    "test_s": "3935"}
    assert measured_times.readme_sentence([*rows, alone]).endswith(
        " `test.sh` alone in a fresh clone, as CI runs it (commit `ci`, 2026-11-29): **65 min 35 s** (3 passed).")
    assert measured_times.render([alone]).splitlines()[2].startswith("| AMD EPYC (2) | test.sh alone")
    assert "| - | 65 min 35 s |" in measured_times.render([alone])


def test_a_new_measurement_replaces_its_settings_row_only():
    old = {field: "" for field in measured_times.FIELDS} | {"cpu": "AMD EPYC", "commands": "c", "commit": "a", "date": "2026-11-01"}
    other = old | {"cpu": "Intel Xeon", "commit": "b"}
    new = old | {"commit": "c", "date": "2026-11-28"}
    merged = measured_times.merge([old, other], new)
    assert merged == [other, new]
    assert measured_times.merge([other], new) == [other, new]


def test_the_table_is_newest_first_with_minutes_and_chapters_slowest_first():
    base = {field: "" for field in measured_times.FIELDS} | {"cores": "2", "commands": "c", "tests": "3 passed"}
    rows = [base | {"cpu": "A", "commit": "a", "date": "2026-11-01", "book_s": "918", "test_s": "59", "chapters_s": "10=508;07=129"},
            base | {"cpu": "B", "commit": "b", "date": "2026-11-28", "book_s": "60", "test_s": "1474", "chapters_s": "", "note": "n"}]
    lines = measured_times.render(rows).splitlines()
    assert len(lines) == 4 and lines[2].startswith("| B (2) | c (n) | `b` | 2026-11-28 | 1 min 0 s | 24 min 34 s | - | 3 passed | - |")
    assert lines[3] == "| A (2) | c | `a` | 2026-11-01 | 15 min 18 s | 59 s | - | 3 passed | 10: 508 s, 07: 129 s |"
    timed = rows[0] | {"unit_s": "75", "tiers_s": "unit=80;integration=300", "slowest": "412 tests/x.py::t | 9 n/a.ipynb::Cell 2"}
    lines = measured_times.render([timed]).splitlines()
    assert "| 1 min 15 s | 3 passed |" in lines[2] and lines[3] == ""
    assert lines[4] == ("- A, c (`a`): the tiers' test time summed over both workers: unit 1 min 20 s, integration 5 min 0 s; "
                        "the ten slowest tests: `tests/x.py::t` 6 min 52 s; `n/a.ipynb::Cell 2` 9 s.")


def test_the_chapters_come_from_the_manifests_executed_notebooks():
    manifest = {"notebooks": [{"name": "07_corrections.ipynb", "status": "ok", "seconds": 129.4},
                              {"name": "10_results_training.ipynb", "status": "ok", "seconds": 507.6},
                              {"name": "12_interventions.ipynb", "status": "failed", "cell": 3}]}
    times = measured_times.chapter_times(manifest)
    assert list(times) == ["10", "07"]
    assert measured_times.format_chapters(times) == "10=508;07=129"
    assert measured_times.parse_chapters("10=508;07=129") == {"10": 508, "07": 129}


@pytest.mark.parametrize(("log", "summary"), [
    ("x\n===== 1022 passed, 2 skipped in 1411.20s (0:23:31) =====\n", "1022 passed, 2 skipped"),
    ("===== 7 failed, 1015 passed, 2 skipped, 3 warnings in 1363.0s =====", "7 failed, 1015 passed, 2 skipped, 3 warnings"),
    ("[book] done\n", ""),
])
def test_pytests_closing_line_gives_the_counts(log, summary):
    assert measured_times.pytest_summary(log) == summary


def test_the_cpu_is_the_first_model_name_line_with_its_family_and_model():
    assert measured_times.cpu_model("processor\t: 0\nmodel name\t: AMD EPYC\nprocessor\t: 1\nmodel name\t: AMD EPYC\n") == "AMD EPYC"
    two = "processor\t: 0\ncpu family\t: 23\nmodel\t\t: 49\nmodel name\t: AMD EPYC 7B12\nstepping\t: 0\n"
    assert measured_times.cpu_model(two) == "AMD EPYC 7B12 (family 23, model 49)"
    assert measured_times.cpu_model(two.replace("49", "1")) != measured_times.cpu_model(two)  # another setting
    assert measured_times.cpu_model("processor\t: 0\n") == "unknown CPU"


def test_the_tiers_and_the_slowest_tests_come_from_pytests_junit_report():
    xml = ("<testsuites><testsuite>"
           '<testcase classname="tests.unit.stats.test_x" name="test_a" time="1.5"/>'
           '<testcase classname="tests.unit.test_y" name="test_b" time="2.0"/>'
           '<testcase classname="tests.acceptance.test_rehearsal" name="test_r[p]" time="300.2"/>'
           '<testcase classname="tests.integration.pipeline.test_z" name="test_c" time="20"/>'
           '<testcase classname="notebooks.07_corrections.ipynb" name="Cell 4" time="0.01"/>'
           "</testsuite></testsuites>")
    tiers, tests = measured_times.junit_times(xml)
    assert tiers == {"unit": 3.5, "integration": 20.0, "acceptance": 300.2, "notebooks": 0.01}
    assert tests[0] == ("tests/acceptance/test_rehearsal.py::test_r[p]", 300.2)
    assert ("notebooks/07_corrections.ipynb::Cell 4", 0.01) in tests
    assert measured_times.format_tiers(tiers) == "unit=4;integration=20;acceptance=300;notebooks=0"
    assert measured_times.format_slowest(tests, 2) == ("300 tests/acceptance/test_rehearsal.py::test_r[p] | "
                                                       "20 tests/integration/pipeline/test_z.py::test_c")


def test_the_markers_must_be_there_once():
    with pytest.raises(ValueError, match="markers"):
        measured_times.replace_table("no markers here", "| table |")
