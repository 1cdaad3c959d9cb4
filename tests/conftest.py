"""Shared fixtures and the test tiers. Every random draw in the tests starts from a fixed seed.

The tier of a test follows from its folder: ``tests/integration`` gets the ``integration`` marker,
``tests/acceptance`` the ``acceptance`` marker, ``tests/unit`` none (so ``-m "not integration and not
acceptance"`` still selects the unit tier). The notebooks' nbval regression is the fourth tier (``notebooks``).
"""

import os
import random
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SEED = 20260
TESTS = Path(__file__).resolve().parent
TIERS = ("integration", "acceptance")
FOLDERS = ("unit", *TIERS)


def tier_of(path: Path) -> str | None:
    """``integration`` or ``acceptance`` for a test file in that folder, else None (unit, or not a test file)."""
    try:
        folder = Path(path).resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):  # outside tests/ (a notebook under nbval)
        return None
    return folder if folder in TIERS else None


#: The test files that read the book's run (tests/book_run.py): they share its xdist group with the notebooks'
#: regression, so one worker makes the run while the other runs the rest.
BOOK_FILES = ("tests/acceptance/test_book.py",)
#: The order the work is handed out under ``-n``, longest first: the book's run and what reads it, then the tiers
#: from the slowest.
ORDER = ("book", "acceptance", "integration", "unit")


def xdist_group(nodeid: str) -> str:
    """The group a test runs in under ``pytest -n N`` (scripts/test.sh): one worker runs a group, in collection
    order. The notebooks' regression and the tests that read the book's run form one group (one worker makes the
    run, ``tests/book_run.py``, and reads it), the tests on a SLURM test cluster another (one cluster at a time
    on this host; their names say ``slurm_cluster``), and every other test file its own (its module fixtures are
    built once)."""
    path, _, name = nodeid.partition("::")
    if path.endswith(".ipynb") or path in BOOK_FILES:
        return "book"
    return "slurm" if "slurm_cluster" in name else path


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler with the project's groups (:func:`xdist_group`) for every load-balancing ``--dist``
    (load, loadscope, loadfile, loadgroup): the notebooks' cells and the book's tests read one run, made once, so
    they never split. Other modes (each, worksteal) keep xdist's own scheduler."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return GroupScheduling(config, log)


def _work_order(item) -> int:
    group = xdist_group(item.nodeid)
    return ORDER.index(group if group == "book" else tier_of(Path(item.path)) or "unit")


def pytest_collection_modifyitems(config, items):
    """Mark each test with its folder's tier. A test file outside the tier folders, or a tier marker written on a
    test in another folder, is an error: the folder is the one place that says what tier a test is. A test on the
    SLURM test cluster says so in its name (its ``xdist_group``). The items are put in :data:`ORDER` (stable:
    the order inside each notebook and each file is kept), so that under ``-n`` the longest work starts first."""
    for item in items:
        path = Path(item.path).resolve()
        if path.is_relative_to(TESTS) and path.relative_to(TESTS).parts[0] not in FOLDERS:
            raise pytest.UsageError(f"{item.nodeid} lives outside the tier folders: move it into tests/unit, "
                                    "tests/integration or tests/acceptance (README: the four tiers)")
        tier = tier_of(path)
        written = {m.name for m in item.iter_markers() if m.name in TIERS} - {tier}
        if written:
            raise pytest.UsageError(
                f"{item.nodeid} is marked {sorted(written)} but lives in the {tier or 'unit'} folder: the folder "
                f"sets the tier, move the test to tests/{sorted(written)[0]}/ and drop the marker")
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        if "slurm" in getattr(item, "fixturenames", ()) and xdist_group(item.nodeid) != "slurm":
            raise pytest.UsageError(f"{item.nodeid} starts a SLURM test cluster: put 'slurm_cluster' in its name, so "
                                    "that it never runs beside another cluster under -n (tests/conftest.py)")
    items.sort(key=_work_order)


@pytest.fixture(autouse=True)
def _fixed_seeds():
    random.seed(SEED)
    np.random.seed(SEED)
    try:
        import torch

        torch.manual_seed(SEED)
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(SEED)


@pytest.fixture
def fast_capture_options():
    """The short capture setting of fast tests: 2048-token windows of pydoc-topics (qkplast.options.PRESETS)."""
    from qkplast.options import PRESETS

    return PRESETS["fast"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Llama checkpoint with its tokenizer, saved like a downloaded model."""
    from tests.helpers import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def slurm(tmp_path_factory):
    """A one-node SLURM cluster (munged, slurmctld, slurmd) for the test; stopped afterwards."""
    from tests.slurm_cluster import Cluster, ClusterError, missing_binaries

    if os.geteuid() != 0:
        pytest.skip("the SLURM daemons need root to start (slurmd runs jobs as their user)")
    missing = missing_binaries()
    if missing:
        pytest.fail(f"SLURM test cluster: {missing} not installed (apt-get install slurm-wlm munge; "
                    "scripts/test.sh does as root)")
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except ClusterError as exc:
        cluster.stop()
        pytest.fail(f"SLURM test cluster did not start: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    """A tiny Llama's config and tokenizer, no weights: all that planning, sizing and validation read."""
    import transformers as T

    from tests.helpers import COMMON, tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny-config")
    T.LlamaConfig(**COMMON).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def smoke_training(tmp_path_factory):
    """One ``qkplast train --preset smoke`` (two seeds, stage A and three arms) for the whole test run:
    ``(directory, training.json)``. Under ``pytest -n`` the workers share it: the first to ask trains it in the
    run's common temporary folder under a file lock, the other waits and reads it (``train`` reuses a finished
    training). Tests read it."""
    import fcntl

    from qkplast.train import PRESETS, train

    # under xdist each worker's temporary folder lies in the test run's own; without it, that one is this process's
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "smoke" / "train"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(shared / "smoke.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return out, train(PRESETS["smoke"], out, progress=False)
