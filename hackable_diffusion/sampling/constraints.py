"""Logit constraints: tokens a canvas position may not take at a denoising step, given the canvas so far.

Constrained decoding (as grammar-constrained decoding of language models): before a step samples, ranks and selects,
every token a task's rules exclude at a position gets a -1e30 logit, so the candidates, the entropies / margins the
selection rule ranks by, and the self-conditioning signal all see only legal tokens. A task implements the protocol
(a puzzle's rules, say) and hands the object to the sampler (`DiffusionSampler.constraint`). Not in DiffusionGemma;
an explicit inference-time option, reported apart from the model-only figures.
"""

from __future__ import annotations

import abc
import dataclasses

from jaxtyping import Array, Bool, Int


@dataclasses.dataclass(frozen=True)
class LogitConstraint(abc.ABC):
    """`constraint(canvas, decided, vocab_size) -> excluded`: True where a position may not take a token.

    decided: the positions whose token is settled (fixed, or committed by a masking process). A position whose every
    token would be excluded should be left unconstrained, so that the step still has a distribution to draw from.
    """

    @abc.abstractmethod
    def __call__(self, canvas: Int[Array, "b c"], decided: Bool[Array, "b c"], vocab_size: int) -> Bool[Array, "b c v"]:
        """The tokens each canvas position may not take, given the tokens at the decided positions."""
