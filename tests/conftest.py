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


def pytest_collection_modifyitems(config, items):
    """Mark each test with its folder's tier. A test file outside the tier folders, or a tier marker written on a
    test in another folder, is an error: the folder is the one place that says what tier a test is."""
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
    """One ``qkplast train --preset smoke`` (two seeds, stage A and three arms) for the whole test session:
    ``(directory, training.json)``. Tests read it; the rehearsals' chapter 10 caches its checkpoint measurements in
    it (``geometry/``, keyed by commit, window and settings), as it would in any training it reads."""
    from qkplast.train import PRESETS, train

    out = tmp_path_factory.mktemp("smoke") / "train"
    return out, train(PRESETS["smoke"], out, progress=False)


@pytest.fixture(scope="session")
def tiny_notebooks(smoke_training):
    """The tiny rehearsals' notebook parameters (``tests.helpers.TINY_NOTEBOOKS``) with chapter 10 reading the
    session's smoke training (a training directory, as ``-p training DIR`` does) instead of training again."""
    from tests.helpers import TINY_NOTEBOOKS

    return {**TINY_NOTEBOOKS, "training": str(smoke_training[0])}

