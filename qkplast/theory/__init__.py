"""Theory: the decay argument's lemmas and theorem checked numerically, planted captures, a model's RoPE.

:mod:`~qkplast.theory.checks` checks Lemma A.1, Lemma A.2 and Theorem 4.4 (and the population rate);
:mod:`~qkplast.theory.planted` draws captures from the positional-semantic model of appendix A.1 with a
known answer, for tests and coverage checks; :mod:`~qkplast.theory.rope` reads a model's own rotary
embedding (section 2.3).
"""

from qkplast.lazy import lazy_names

__all__ = ["check_lemma_a1", "check_lemma_a2", "check_population_rate", "check_theorem_4_4", "model_rotary",
           "planted_capture"]


#: Where each public name lives. The names load on first use (PEP 562): :mod:`~qkplast.theory.checks` imports scipy
#: and :mod:`~qkplast.theory.rope` torch, which a chapter drawing a finished run's figures never needs.
_HOMES = {
    "checks": ("check_lemma_a1", "check_lemma_a2", "check_population_rate", "check_theorem_4_4"),
    "planted": ("planted_capture",),
    "rope": ("model_rotary",),
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
