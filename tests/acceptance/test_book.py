"""The built book in a real browser: math typeset offline, numbered theorem blocks, figures loaded, no page noisy
(progress bars, kernel warnings), and the book is the one ``scripts/book.sh`` builds.

The book is built as ``book.sh`` builds it: the default run's notebooks executed by ``qkplast run --out
runs/smollm2-135m --jobs 2`` (``tests/book_run.py``, once per test run; the notebooks' regression compares the
same executions with the committed notebooks), papermill's injected cell folded into each parameters cell, then
Jupyter Book with warnings as errors into a temporary copy, served on localhost and opened in headless Chromium.
Screenshots are kept under ``test-artifacts/``.
"""

import functools
import http.server
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers import ROOT

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1600",
]

NO_BROWSER = "Debian chromium and chromium-driver are not installed (.ci/run installs them)"
#: At most this many stderr output blocks on a page: a warning or a summary line is fine, a progress bar (one
#: block per redraw) is not.
MAX_STDERR_BLOCKS = 3
#: ipykernel's warning when the kernel manager starts it over TCP without CurveZMQ keys (once per notebook).
TRANSPORT_WARNING = "running over TCP without encryption"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from qkplast.pipeline.book import fold_injected_parameters
    from tests.book_run import book_run

    made = book_run()
    assert made.returncode == 0, made.output
    src = tmp_path_factory.mktemp("book")
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "book", src / "book", ignore=shutil.ignore_patterns("notebooks"))
    (src / "book" / "notebooks").mkdir()
    for nb in sorted((made.run_dir / "notebooks").glob("[0-9][0-9]_*.ipynb")):  # book.sh's step 3
        shutil.copy(nb, src / "book" / "notebooks" / nb.name)
        fold_injected_parameters(src / "book" / "notebooks" / nb.name)
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run(
        [str(jb), "build", str(src), "--warningiserror", "--nitpick", "--keep-going", "--builder", "html"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # the book shows the executed notebooks and starts no kernel; if it ever did, it must start them quietly
    assert TRANSPORT_WARNING not in proc.stdout + proc.stderr
    html = src / "_build" / "html"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", html
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip(NO_BROWSER)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def render(browser, url: str, shot: str) -> str:
    """Open ``url``, wait for MathJax to finish typesetting, save a screenshot, return the page text."""
    browser.get(url)
    # Sphinx loads MathJax only on pages that contain math
    state = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "if (!document.querySelector('script[src*=mathjax]')) { done('no math'); return; }"
        "const wait = () => (window.MathJax && MathJax.startup && MathJax.startup.promise)"
        "  ? MathJax.startup.promise.then(() => done('typeset')) : setTimeout(wait, 100);"
        "wait();"
    )
    assert state in ("typeset", "no math")
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / shot))
    return browser.execute_script("return document.body.innerText;")


def assert_offline_math_and_resources(browser, base: str, math: bool = True):
    n_math = browser.execute_script("return document.querySelectorAll('mjx-container').length;")
    assert (n_math > 0) == math, f"typeset math expected: {math}, found {n_math} formulas"
    raw = browser.execute_script(
        "const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT); const bad = [];"
        "while (walker.nextNode()) { const t = walker.currentNode.textContent;"
        "  const p = walker.currentNode.parentElement;"
        "  if (p.closest('script, style, pre, code, mjx-assistive-mml')) continue;"
        "  if (t.includes('\\\\(') || t.includes('$$') || t.includes('\\\\[')) bad.push(t.slice(0, 80)); }"
        "return bad;"
    )
    assert raw == [], f"raw TeX left in the rendered DOM: {raw[:3]}"
    resources = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name);")
    foreign = [r for r in resources if not r.startswith(base)]
    assert foreign == [], f"the page fetched resources from elsewhere: {foreign}"
    if math:
        assert any("/_static/mathjax/" in r for r in resources), "MathJax must be served from the build"


def test_theory_page(site, browser):
    base, _ = site
    text = render(browser, f"{base}/book/notebooks/06_theory.html", "theory.png")
    assert_offline_math_and_resources(browser, base)
    assert re.search(r"Theorem \d+ \(Plasticity decay", text), "the theorem block is not numbered"
    assert re.search(r"Lemma \d+ \(Gaussian score difference", text)
    assert re.search(r"Lemma \d+ \(Single-pair decay", text)
    assert text.count("Proof") >= 3
    assert "PASS Lemma A.1" in text and "PASS Theorem 4.4" in text  # the executed checks are on the page
    assert_images_loaded(browser, minimum=1)


def test_notebook_page_with_figures(site, browser):
    base, _ = site
    text = render(browser, f"{base}/book/notebooks/05_plasticity.html", "plasticity.png")
    assert_offline_math_and_resources(browser, base)
    assert re.search(r"Definition \d+ \(Pairwise plasticity\)", text)
    assert re.search(r"Proposition \d+ \(Householder decomposition\)", text)
    assert re.search(r"Proposition \d+ \(Gaussian closed form\)", text)
    assert_images_loaded(browser, minimum=3)


def test_cross_references_resolve(site, browser):
    base, html = site
    page = (html / "book" / "notebooks" / "04_rotation.html").read_text()
    assert "prop-drift-axis" in page and "07_corrections.html" in page
    text = render(browser, f"{base}/book/notebooks/04_rotation.html", "rotation.png")
    assert re.search(r"Proposition \d+ \(Closed form of the drift axis\)", text)


def assert_images_loaded(browser, minimum: int):
    sizes = browser.execute_script("return Array.from(document.images).map(i => [i.src, i.complete, i.naturalWidth]);")
    figures = [s for s in sizes if "/_images/" in s[0]]
    assert len(figures) >= minimum, f"expected at least {minimum} figures, found {figures}"
    broken = [s[0] for s in figures if not (s[1] and s[2] > 0)]
    assert broken == [], f"figures that did not load: {broken}"


def test_results_pages(site, browser):
    base, _ = site
    text = render(browser, f"{base}/book/notebooks/09_results_plasticity.html", "results_plasticity.png")
    assert_offline_math_and_resources(browser, base, math=False)
    assert "thesis: Qwen-3" in text and "95% basic" in text and "95% BCa" in text and "stdlib-code" in text
    assert_images_loaded(browser, minimum=4)
    text = render(browser, f"{base}/book/notebooks/11_results_benchmark.html", "results_benchmark.png")
    assert_offline_math_and_resources(browser, base)
    assert "spearman_rho" in text and "Where this project" in text
    assert_images_loaded(browser, minimum=1)


def test_no_page_is_noisy(site, browser):
    """No rendered notebook page holds a progress bar: at most a handful of stderr blocks (myst-nb renders each
    stderr stream output as ``div.output.stderr``, stdout ones as ``div.output.stream``)."""
    base, html = site
    pages = sorted((html / "book" / "notebooks").glob("[0-9][0-9]_*.html"))
    assert len(pages) == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    counts, streams = {}, 0
    for page in pages:
        browser.get(f"{base}/book/notebooks/{page.name}")
        counts[page.stem], stdout = browser.execute_script(
            "return [document.querySelectorAll('div.output.stderr').length,"
            " document.querySelectorAll('div.output.stream').length];")
        streams += stdout
        text = browser.execute_script("return document.body.innerText;")
        assert not re.search(r"\d+%\|", text), f"{page.name} shows a progress bar"
    assert streams > 0, "no stream output found: the selectors no longer match myst-nb's classes"
    noisy = {name: n for name, n in counts.items() if n > MAX_STDERR_BLOCKS}
    assert noisy == {}, f"pages with more than {MAX_STDERR_BLOCKS} stderr output blocks: {noisy}"


def test_chapter_10_of_the_built_book_reads_the_committed_full_run(site, browser):
    """The book's chapter 10 decides from the full run trained on a GPU (``data/miniature-full``), not from a
    preview trained on the page: its provenance line names the GPU, and nothing was trained into the run."""
    import json

    base, html = site
    render(browser, f"{base}/book/notebooks/10_results_training.html", "results_training.png")
    # what the cells printed (the page's code cells name the preview too, in the branch not taken)
    text = browser.execute_script(
        "return Array.from(document.querySelectorAll('div.cell_output')).map(e => e.innerText).join('\\n');")
    provenance = json.loads((ROOT / "data" / "miniature-full" / "provenance.json").read_text())
    assert f"trained and measured on {provenance['gpu']}" in text, "chapter 10 does not show the committed full run"
    assert "the committed full run: 8 seeds" in text and "checkpoints x 2 windows" in text
    assert "the preview trained on this page" not in text and "the preview has no pilots" not in text
    assert not (ROOT / "runs" / "smollm2-135m" / "training" / "miniature").exists()


def test_no_page_shows_where_this_machine_keeps_the_run(site):
    """qkplast run passes the run directory absolute; the folded parameters cells show it relative to the
    notebooks, so no page names a folder of this machine (the checkout, the temporary folders)."""
    import nbformat

    base, html = site
    for page in sorted((html / "book" / "notebooks").glob("[0-9][0-9]_*.html")):
        text = page.read_text()
        assert str(ROOT) not in text and "/tmp/" not in text, page.name
    for nb in sorted((html.parent.parent / "book" / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cell = next(c for c in nbformat.read(nb, 4).cells if "parameters" in c.metadata.get("tags", []))
        assert 'run_dir = "../runs/smollm2-135m"' in cell.source, (nb.name, cell.source)


def test_notebook_kernels_start_without_transport_warning(tmp_path, capfd):
    """``qkplast run``'s notebook stage (papermill, two kernels at once) prints no kernel transport warning.

    A cell writes a probe to the kernel process's own stderr, which proves the kernels' stderr is captured here.
    """
    import json

    from qkplast.pipeline.stages import notebook_stage

    paths = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.ipynb"
        path.write_text(json.dumps({
            "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [
                {"cell_type": "code", "id": "p", "metadata": {"tags": ["parameters"]}, "execution_count": None,
                 "outputs": [], "source": 'run_dir = ""'},
                {"cell_type": "code", "id": "c", "metadata": {}, "execution_count": None, "outputs": [],
                 "source": f'import os\nos.write(2, b"probe-{name}\\n")\nprint(6 * 7)'},
            ]}))
        paths.append(path)
    out = tmp_path / "run"
    out.mkdir()
    manifest = {"notebooks": [], "timings_s": {}}
    notebook_stage(out, manifest, {}, paths, jobs=2, progress=False)
    assert [e["status"] for e in manifest["notebooks"]] == ["ok", "ok"]
    executed = json.loads((out / "notebooks" / "a.ipynb").read_text())
    assert executed["cells"][-1]["outputs"][0]["text"] in ("42\n", ["42\n"])
    err = capfd.readouterr().err
    assert "probe-a" in err and "probe-b" in err, err[-2000:]
    assert TRANSPORT_WARNING not in err, err[-2000:]
