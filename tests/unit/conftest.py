"""The unit tier's rule, checked on every unit test: it loads no model weights from disk, starts no Python process,
Jupyter kernel, browser or cluster daemon (such a test belongs in tests/integration or tests/acceptance).

System probes that libraries run on their own (``uname -p`` from ``platform``, ``pandoc --version`` from jupytext)
stay allowed: the rule is about what a test runs, not what an import looks up.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

#: Programs a unit test may not start (prefixes of the program's file name; python covers this interpreter).
FORBIDDEN_PROGRAMS = ("python", "jupyter", "ipykernel", "papermill", "qkplast", "chrom", "sbatch", "srun", "slurm",
                      "munge")
MOVE = "belongs in tests/integration (or tests/acceptance), not in the unit tier"


class UnitTierError(AssertionError):
    """A unit test did what only integration and acceptance tests may do."""


def _program(args) -> str:
    first = args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]
    return Path(str(first)).name


def _guarded_popen(original):
    def popen(self, args, *rest, **kwargs):
        program = _program(args)
        if program.startswith(FORBIDDEN_PROGRAMS):
            raise UnitTierError(f"this test starts {program!r} (a subprocess): it {MOVE}")
        return original(self, args, *rest, **kwargs)

    return popen


def _refuse(what):
    def refuse(*args, **kwargs):
        raise UnitTierError(f"this test {what}: it {MOVE}")

    return refuse


@pytest.fixture(scope="module", autouse=True)
def _unit_tier_rule():
    """Turn a subprocess, a model loaded through qkplast's loader or the embedded model's preparation into a failure
    naming it.

    Module scope, so that it is in place before the module's other fixtures (autouse ones are set up first).
    Every weight read goes through ``PreTrainedModel.from_pretrained`` (qkplast's ``load_model`` and a test's own
    call alike; building a model from its config, as the planner does on the meta device, reads none), and
    ``prepare_default_model`` converts the embedded GGUF: it is looked up in its module at call time, so
    replacing it here catches every use of the embedded model.
    """
    from transformers import PreTrainedModel

    from qkplast.capture import models

    def refuse_weights(*args, **kwargs):
        raise UnitTierError(f"this test loads model weights from disk (from_pretrained): it {MOVE}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", _guarded_popen(subprocess.Popen.__init__))
        patch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse_weights))
        patch.setattr(models, "prepare_default_model", _refuse("prepares the embedded SmolLM2 (reads its GGUF)"))
        yield
