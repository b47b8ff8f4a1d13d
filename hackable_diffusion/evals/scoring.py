"""Scores and continues (context, continuation) requests with any toolbox text run: the engine behind the
lm-evaluation-harness adapter (`evals/lm_eval_adapter.py`), usable on its own.

Log-likelihoods follow the conventions of the diffusion-LM papers that report lm-eval tasks (LLaDA, Dream, BD3-LM):
- autoregressive run: the exact log p(continuation | BOS + context) from one causal pass, and lm-eval's greedy flag
  (every continuation token is the argmax);
- diffusion run: minus the block-diffusion ELBO of the continuation given the context, averaged over `num_draws`
  Monte-Carlo draws of noise levels and corruptions from a fixed seed (a lower bound on log p in expectation). It is
  the estimator of `evaluate` (`DiffusionPretrainObjective.elbo_per_example`, the run's time
  sampler and loss weighting), with the context held fixed (clean, never scored). The context is left-padded so that
  the continuation starts on a canvas boundary: every continuation canvas attends to the whole clean context through
  the encoder's KV cache, as in generation. The greedy flag of a diffusion run decodes the continuation with the run's
  sampler at temperature 1e-4 (argmax in practice) and its number of steps, and compares the tokens.

Rolling log-likelihoods (perplexity tasks) cut BOS + the document into windows of at most the training sequence length,
each conditioned on the window's last `context_len` tokens before it (lm-eval's `get_rolling_token_windows` layout),
and sum them; for a diffusion run the sum is a bound, reported as such.

Shapes: every batch has `batch_size` rows (the last one padded), contexts and continuations whole canvases, prompts a
multiple of PROMPT_BUCKET tokens, so a stream of requests compiles each program once per bucket (docs/compilation.md).

Deliberate difference from the harness's Hugging Face model: a request longer than the training sequence length keeps
the continuation and the *end* of the context (as the harness does), but a continuation that alone exceeds it raises
ValueError instead of being cut.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from hackable_diffusion import builders
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling import generate as gen_lib
from hackable_diffusion.sampling.temperature import AnnealedTemperature
from hackable_diffusion.tasks.capabilities import GeneratesText, require

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment

GREEDY_TEMPERATURE = 1e-4  # the diffusion sampler's temperature for greedy decoding (argmax in practice)
PROMPT_BUCKET = 16  # prompt widths are rounded up to a multiple of this: a few compiled decodes serve every request


@dataclasses.dataclass(frozen=True)
class Score:
    """One request's log-likelihood in nats (an ELBO bound for a diffusion run), its Monte-Carlo standard error (0 for
    an exact figure), whether the continuation is the greedy decode, and how many tokens were scored."""

    logprob: float
    stderr: float
    is_greedy: bool
    num_tokens: int


def _bucket(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


@dataclasses.dataclass(frozen=True)
class Scorer:
    """Log-likelihoods and generations of one run (`experiment.from_workdir` + `toolbox.load_params`).

    num_draws: Monte-Carlo draws per request (diffusion); seed: the noise seed (diffusion) and sampling seed;
    batch_size: requests per compiled call; max_length: the longest sequence scored (0 = the run's `data.seq_len`);
    greedy_check: compute the greedy flag of a diffusion run (one sampler decode per request).
    """

    exp: Experiment
    params: Any
    num_draws: int = 8
    seed: int = 0
    batch_size: int = 8
    max_length: int = 0
    greedy_check: bool = True

    def __post_init__(self):
        if self.num_draws < 1 or self.batch_size < 1:
            raise ValueError(f"num_draws and batch_size must be >= 1, got {self.num_draws} and {self.batch_size}.")
        require(self.exp.task, GeneratesText, "the lm-eval adapter's text scorer")

    # -- shapes ---------------------------------------------------------------------------------------------------

    @property
    def is_autoregressive(self) -> bool:
        return self.exp.is_autoregressive

    @property
    def sequence_length(self) -> int:
        return int(self.max_length or self.exp.config.data.seq_len)

    @property
    def canvas_len(self) -> int:
        d = self.exp.config.diffusion
        return int(d.canvas_len or self.sequence_length)

    @functools.cached_property
    def _greedy_sampler(self):
        """The run's sampler at the greedy temperature, built once (a static argument of the compiled decode)."""
        return builders.build_sampler(self.exp.config, self.exp.process).replace(
            temperature=AnnealedTemperature(GREEDY_TEMPERATURE, GREEDY_TEMPERATURE)
        )

    @functools.cached_property
    def _generation_canvas(self) -> int:
        return 1 if self.is_autoregressive else builders.build_sampler(self.exp.config, self.exp.process).canvas_length

    def _prompt_batch(self, prompts: Sequence[Sequence[int]]) -> tuple[Int[Array, "b w"], Array]:
        """Right-padded prompts as `batch_size` rows of a width rounded up to PROMPT_BUCKET (spare rows hold a lone
        BOS and are discarded): every batch of a request stream, the last partial one included, has one of a few
        shapes, so the compiled decode is reused instead of rebuilt for each batch."""
        if not 0 < len(prompts) <= self.batch_size:
            raise ValueError(f"a prompt batch holds 1 to {self.batch_size} prompts, got {len(prompts)}.")
        width = _bucket(max(len(p) for p in prompts), PROMPT_BUCKET)
        tokens = np.full((self.batch_size, width), PAD_ID, np.int32)
        mask = np.zeros((self.batch_size, width), bool)
        tokens[:, 0], mask[:, 0] = BOS_ID, True
        for i, prompt in enumerate(prompts):
            tokens[i, : len(prompt)], mask[i, : len(prompt)] = prompt, True
        return jnp.asarray(tokens), jnp.asarray(mask)

    def encode(self, text: str) -> list[int]:
        try:
            return list(self.exp.tokenizer.encode(text))
        except ValueError as err:
            raise ValueError(f"cannot tokenize {text[:60]!r} with this run's tokenizer: {err}") from None

    def fit(self, context: Sequence[int], continuation: Sequence[int]) -> tuple[list[int], list[int]]:
        """BOS + context + continuation cut to `sequence_length` tokens, keeping the end of the context."""
        context, continuation = [BOS_ID] + [t for t in context if t != BOS_ID], list(continuation)
        if not continuation:
            raise ValueError("an empty continuation has no likelihood; give at least one token.")
        room = self.sequence_length - len(continuation)
        if room < 1:
            raise ValueError(
                f"the continuation has {len(continuation)} tokens but the run scores at most {self.sequence_length} "
                f"(BOS included) in one window; split it with `pieces`."
            )
        if len(context) > room:
            context = [BOS_ID] + context[len(context) - room + 1 :]
        return context, continuation

    def pieces(self, context: Sequence[int], continuation: Sequence[int]) -> list[tuple[list[int], list[int]]]:
        """(context, continuation) windows that each fit `sequence_length`: the request itself when it fits (context
        cut from the left), else the continuation in chunks of half a window, each conditioned on the tokens before
        it (chain rule: the log-likelihoods, or their bounds, add up)."""
        continuation = list(continuation)
        if len(continuation) < self.sequence_length:
            return [self.fit(context, continuation)]
        chunk = max(self.sequence_length // 2, 1)
        before = [t for t in context if t != BOS_ID]
        return [
            self.fit(before + continuation[:start], continuation[start : start + chunk])
            for start in range(0, len(continuation), chunk)
        ]

    # -- log-likelihoods --------------------------------------------------------------------------------------------

    def loglikelihood(
        self,
        requests: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[Score]:
        """(context ids, continuation ids) -> Score, in request order (a request longer than a window is scored in
        `pieces`); `progress(n)` when n more requests are done."""
        windows, owner = [], []
        for i, (context, continuation) in enumerate(requests):
            for window in self.pieces(context, continuation):
                windows.append(window)
                owner.append(i)
        scores: list[Score] = []
        done = 0
        for start in range(0, len(windows), self.batch_size):
            chunk = windows[start : start + self.batch_size]
            scores += self._score_ar(chunk) if self.is_autoregressive else self._score_diffusion(chunk)
            end = start + len(chunk)
            finished = len(requests) if end == len(windows) else owner[end]  # requests wholly scored so far
            if progress and finished > done:
                progress(finished - done)
                done = finished
        return _combine(scores, owner, len(requests))

    def rolling_windows(self, tokens: Sequence[int], context_len: int = 1) -> list[tuple[list[int], list[int]]]:
        """(context, continuation) windows covering the tokens: each conditioned on BOS and the `context_len` tokens
        before it (BOS alone for the first), at most `sequence_length` tokens in all."""
        tokens = list(tokens)
        step = self.sequence_length - 1 - max(context_len, 1)
        if step < 1:
            raise ValueError(f"context_len={context_len} leaves no room in {self.sequence_length}-token windows.")
        windows, full = [], [BOS_ID] + tokens
        for begin in range(1, len(full), step):
            windows.append((full[max(begin - context_len, 0) : begin], full[begin : begin + step]))
        return windows

    def loglikelihood_rolling(
        self, documents: Sequence[Sequence[int]], *, progress: Callable[[int], None] | None = None
    ) -> list[Score]:
        """Each document's total log-likelihood (an ELBO bound for a diffusion run) over rolling windows; the greedy
        flag of a diffusion run is not computed here (False)."""
        windows, owner = [], []
        for i, doc in enumerate(documents):
            for context, continuation in self.rolling_windows(doc):
                windows.append((context[1:] if context[:1] == [BOS_ID] else context, continuation))
                owner.append(i)
        # A rolling log-likelihood has no greedy flag (lm-eval reads the number alone): no decode per window.
        scorer = dataclasses.replace(self, greedy_check=False) if self.greedy_check else self
        scores = scorer.loglikelihood(windows, progress=progress)
        return _combine(scores, owner, len(documents))

    def _score_ar(self, rows: list[tuple[list[int], list[int]]]) -> list[Score]:
        width = _bucket(max(len(c) + len(x) for c, x in rows), 16)
        tokens = np.full((self.batch_size, width), PAD_ID, np.int32)
        target = np.zeros((self.batch_size, width), bool)
        for i, (context, continuation) in enumerate(rows):
            seq = context + continuation
            tokens[i, : len(seq)] = seq
            target[i, len(context) : len(seq)] = True
        logprob, greedy = _ar_scores(self.exp.model, self.params, jnp.asarray(tokens), jnp.asarray(target))
        logprob, greedy = np.asarray(logprob), np.asarray(greedy)
        return [Score(float(logprob[i]), 0.0, bool(greedy[i]), len(x)) for i, (_, x) in enumerate(rows)]

    def diffusion_layout(self, rows: list[tuple[list[int], list[int]]]) -> dict[str, np.ndarray]:
        """The batch of `DiffusionPretrainObjective`: each context left-padded and each continuation right-padded to
        whole canvases (continuations start on a canvas boundary), the context `fixed`, padding weight 0."""
        c = self.canvas_len
        ctx_slots = max(_bucket(len(ctx), c) for ctx, _ in rows)
        cont_slots = max(_bucket(len(x), c) for _, x in rows)
        width = ctx_slots + cont_slots
        tokens = np.full((self.batch_size, width), PAD_ID, np.int32)
        weights = np.zeros((self.batch_size, width), np.float32)
        fixed = np.zeros((self.batch_size, width), bool)
        for i, (context, continuation) in enumerate(rows):
            tokens[i, ctx_slots - len(context) : ctx_slots] = context
            tokens[i, ctx_slots : ctx_slots + len(continuation)] = continuation
            weights[i, ctx_slots - len(context) : ctx_slots + len(continuation)] = 1.0
            fixed[i, ctx_slots - len(context) : ctx_slots] = True
        return {"tokens": tokens, "weights": weights, "fixed": fixed}

    def _score_diffusion(self, rows: list[tuple[list[int], list[int]]]) -> list[Score]:
        batch = {k: jnp.asarray(v) for k, v in self.diffusion_layout(rows).items()}
        keys = jax.random.split(jax.random.key(self.seed), self.num_draws)
        draws = np.asarray(_elbo_draws(self.exp.objective, self.params, batch, keys))[:, : len(rows)]  # (N, b) nats
        mean = -draws.mean(0)
        se = draws.std(0, ddof=1) / math.sqrt(self.num_draws) if self.num_draws > 1 else np.zeros(len(rows))
        greedy = self._greedy_diffusion(rows) if self.greedy_check else [False] * len(rows)
        return [Score(float(mean[i]), float(se[i]), greedy[i], len(x)) for i, (_, x) in enumerate(rows)]

    def _greedy_diffusion(self, rows: list[tuple[list[int], list[int]]]) -> list[bool]:
        longest = max(len(x) for _, x in rows)
        sampler = self._greedy_sampler
        prompts, prompt_mask = self._prompt_batch([ctx for ctx, _ in rows])
        result = gen_lib.generate(
            self.exp.model,
            self.params,
            prompts,
            prompt_mask=prompt_mask,
            sampler=sampler,
            key=self.seed,
            max_new_tokens=_bucket(longest, sampler.canvas_length),
            stop_tokens=(),
        )
        decoded = np.asarray(result.tokens)
        return [bool(np.array_equal(decoded[i, : len(x)], x)) for i, (_, x) in enumerate(rows)]

    # -- generation -------------------------------------------------------------------------------------------------

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """Token ids generated after BOS + each context (the run's sampler: canvas after canvas for a diffusion run,
        ending at the first EOS, which a canvas may hold anywhere; the run's AR temperature for an AR run)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        out: list[list[int]] = []
        # A few lengths (whole canvases, or multiples of PROMPT_BUCKET tokens for an AR run): a few compiled decoders;
        # the tokens past max_new_tokens are cut.
        new = _bucket(max_new_tokens, PROMPT_BUCKET if self.is_autoregressive else self._generation_canvas)
        for start in range(0, len(contexts), self.batch_size):
            chunk = contexts[start : start + self.batch_size]
            keep = max(self.sequence_length - max_new_tokens - 1, 0)  # context tokens that fit before the new ones
            rows = [[BOS_ID] + ([t for t in ctx if t != BOS_ID][-keep:] if keep else []) for ctx in chunk]
            prompts, prompt_mask = self._prompt_batch(rows)
            key = jax.random.fold_in(jax.random.key(self.seed), start)
            result = self.exp.task.generate_tokens(
                self.exp, self.params, prompts, prompt_mask=prompt_mask, key=key, max_new_tokens=new
            )
            tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
            for i in range(len(chunk)):
                row = [int(t) for t in tokens[i, : min(int(lengths[i]), max_new_tokens)]]
                out.append(row[: row.index(EOS_ID)] if EOS_ID in row else row)
            if progress:
                progress(len(chunk))
        return out


def _combine(scores: list[Score], owner: list[int], count: int) -> list[Score]:
    """Per request, the sum of its windows' log-likelihoods (chain rule), their errors added in quadrature."""
    out = []
    for i in range(count):
        mine = [s for s, o in zip(scores, owner) if o == i]
        out.append(
            Score(
                logprob=float(sum(s.logprob for s in mine)),
                stderr=float(math.sqrt(sum(s.stderr**2 for s in mine))),
                is_greedy=all(s.is_greedy for s in mine),
                num_tokens=sum(s.num_tokens for s in mine),
            )
        )
    return out


@jax.jit
def _ar_logprobs(logits: Float[Array, "b l V"], tokens: Int[Array, "b l"], target: Array):
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    nxt, tgt = tokens[:, 1:], target[:, 1:]
    picked = jnp.take_along_axis(logp, nxt[..., None], axis=-1)[..., 0]
    greedy = jnp.argmax(logp, axis=-1) == nxt
    return jnp.sum(jnp.where(tgt, picked, 0.0), -1), jnp.all(greedy | ~tgt, -1)


def _ar_scores(model: T.Transformer, params, tokens: Int[Array, "b l"], target: Array):
    logits, _ = _causal_forward(model, params, tokens)
    return _ar_logprobs(logits, tokens, target)


@functools.partial(jax.jit, static_argnums=0)
def _causal_forward(model: T.Transformer, params, tokens: Int[Array, "b l"]):
    return T.forward(model, params, tokens, token_mask=tokens != PAD_ID, causal=True)


@functools.partial(jax.jit, static_argnums=0)
def _elbo_draws(objective, params, batch: dict[str, Array], keys: Array) -> Float[Array, "n b"]:
    """Minus log-likelihood bounds (nats) of every row, one per key."""
    return jax.lax.map(lambda key: objective.elbo_per_example(params, batch, key)[0], keys)
