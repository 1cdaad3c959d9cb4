"""The walk of one ``qkplast run --stage capture``: every check, config and tokenizer load and corpus pass, in order.

Wraps the functions named in :data:`STOPS` (in every qkplast module that imported them by name), runs the capture
stage of a tiny random-weight Llama saved locally (two 64-token windows of pydoc-topics, the code capture of
stdlib-code beside it), and prints each call with the model load marked, then the count of each. Issue 38's closing
note compares this walk before and after the one-preflight change (83 calls then, 38 now)::

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python benchmarks/walk_capture.py

``tests/integration/capture/test_preflight.py`` holds the counts that matter as assertions.
"""

from __future__ import annotations

import functools
import importlib
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: module -> the functions whose calls the walk logs
STOPS = {
    "qkplast.rundir.products": ["check_same_capture", "ensure_capture"],
    "qkplast.pipeline.stages": ["check_before_weights", "check_windows", "check_memory"],
    "qkplast.capture.plan": ["preflight", "plan_capture", "size_code_capture"],
    "qkplast.capture.models": ["load_config", "load_tokenizer_with_info", "check_seq_len", "load_model", "loading_device"],
    "qkplast.capture.kernel_guard": ["kernel_problem"],
    "qkplast.capture.corpus": ["open_corpus", "iter_windows", "count_windows"],
    "qkplast.capture.driver": ["run_capture"],
    "qkplast.capture.resume": ["check_output"],
}
#: for a corpus pass, the corpus it reads
CORPUS_CALLS = ("iter_windows", "count_windows")


def logged(fn, label: str, log: list[str]):
    """``fn`` that appends ``label`` (with the corpus for a pass) to ``log`` on every call."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        corpus = getattr(args[0], "spec", "") if label.endswith(CORPUS_CALLS) and args else ""
        log.append(f"{label}({corpus})")
        return fn(*args, **kwargs)
    return wrapper


def instrument(log: list[str]) -> None:
    """Replace each stop by its logged wrapper, in its module and wherever a qkplast module imported it by name."""
    import qkplast.pipeline.cli  # noqa: F401  (imports every module the run reaches)

    wrappers = {}
    for module, names in STOPS.items():
        mod = importlib.import_module(module)
        for name in names:
            fn = getattr(mod, name)
            wrappers[id(fn)] = logged(fn, f"{module.rsplit('.', 1)[1]}.{name}", log)
    for mod in [m for name, m in sys.modules.items() if name.startswith("qkplast")]:
        for attr, value in list(vars(mod).items()):
            if callable(value) and id(value) in wrappers:
                setattr(mod, attr, wrappers[id(value)])


def main() -> int:
    from tests.helpers import save_tiny_checkpoint

    log: list[str] = []
    instrument(log)
    from qkplast.pipeline.cli import main as cli

    tmp = Path(tempfile.mkdtemp())
    model = save_tiny_checkpoint(tmp / "tiny")
    code = cli(["run", "--stage", "capture", "--out", str(tmp / "run"), "--model", str(model), "--corpus",
                "pydoc-topics", "--docs", "2", "--seq-len", "64", "--bucket-size", "16", "--samples-per-bucket", "2",
                "--heads", "5", "--short-docs", "concat", "--device", "cpu", "--no-progress"])
    for i, line in enumerate(log, 1):
        print(f"{i:3d} {line}{'   <- the weights load' if line.startswith('models.load_model') else ''}")
    print(f"exit {code}; {len(log)} calls:", dict(sorted(Counter(line.split('(')[0] for line in log).items())))
    return code


if __name__ == "__main__":
    sys.exit(main())
