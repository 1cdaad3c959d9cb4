"""Theory: the decay argument's lemmas and theorem checked numerically, planted captures, a model's RoPE.

:mod:`~qkplast.theory.checks` checks Lemma A.1, Lemma A.2 and Theorem 4.4 (and the population rate);
:mod:`~qkplast.theory.planted` draws captures from the positional-semantic model of appendix A.1 with a
known answer, for tests and coverage checks; :mod:`~qkplast.theory.rope` reads a model's own rotary
embedding (section 2.3).
"""

from qkplast.theory.checks import check_lemma_a1, check_lemma_a2, check_population_rate, check_theorem_4_4
from qkplast.theory.planted import planted_capture
from qkplast.theory.rope import model_rotary

__all__ = ["check_lemma_a1", "check_lemma_a2", "check_population_rate", "check_theorem_4_4", "model_rotary",
           "planted_capture"]
