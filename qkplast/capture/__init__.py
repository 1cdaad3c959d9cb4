"""Capture: a model and a corpus in, a capture file out (the post-RoPE queries and keys attention receives).

Thesis sections 4.1 and 5.4. Resolving and loading models (:mod:`~qkplast.capture.models`), corpora cut
into windows (:mod:`~qkplast.capture.corpus`), the attention hook (:mod:`~qkplast.capture.hooks`,
:mod:`~qkplast.capture.recorder`), which heads and positions are kept (:mod:`~qkplast.capture.sampling`,
:mod:`~qkplast.capture.architecture`), the kernel guard, resumable document parts
(:mod:`~qkplast.capture.resume`), the plan made from the config alone (:mod:`~qkplast.capture.plan`) and
the orchestrator (:mod:`~qkplast.capture.driver`). Nothing here analyses a capture.
"""

from qkplast.lazy import lazy_names

__all__ = [
    "DEFAULT_MODEL", "CapturePlan", "Corpus", "CorpusError", "Document", "LoadedModel", "ModelError", "PlanError",
    "UnsupportedModelError", "capture", "count_windows", "iter_windows", "load_config", "load_model", "load_tokenizer",
    "open_corpus", "open_corpus_for", "plan_capture", "preflight", "prepare_default_model", "release_model", "run_capture",
    "split_revision", "text_decoder",
]


#: Where each public name lives. The names load on first use (PEP 562): :mod:`~qkplast.capture.driver` imports
#: xarray and torch, which what reads a corpus, a model's config or a study's revisions never needs (``qkplast
#: study --status`` took 1.6 s of imports for it).
_HOMES = {
    "corpus": ("Corpus", "CorpusError", "Document", "count_windows", "iter_windows", "open_corpus", "open_corpus_for"),
    "driver": ("capture", "run_capture"),
    "hooks": ("UnsupportedModelError", "text_decoder"),
    "models": ("DEFAULT_MODEL", "LoadedModel", "ModelError", "load_config", "load_model", "load_tokenizer",
               "prepare_default_model", "release_model", "split_revision"),
    "plan": ("CapturePlan", "PlanError", "plan_capture", "preflight"),
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
