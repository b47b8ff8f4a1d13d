"""Per-token log-probabilities of sampled completions under a policy: what every RL objective differentiates.

* `MeanFieldScorer` (diffusion runs; d1, Zhao et al. 2025): ONE bidirectional forward pass with every completion
  position masked (and, when `prompt_masked` marks some, those prompt positions too) gives a factorised
  distribution over the completion; a completion's sequence log-probability is the sum of its tokens' log-probs
  under it. Not the sampler's probability (the sampler commits tokens over several passes), but one network pass,
  as d1 uses it; the masking ELBO (`objectives.ElboPolicyGradient`) is the bound-based alternative. The mask token's
  logit is dropped (it is never a clean token), as in the ELBO.
* `TrajectoryScorer` (diffusion runs; TraceRL, Wang et al. 2025): the sampler's own factorisation. The rollout
  records the pass at which each completion position was committed (`commit_pass`); the position's log-prob is read
  from a pass over the canvas as it stood then (earlier commits in place, the rest masked). With one forward per
  sampler pass this is the sampler's exact probability of the completion whenever its choice of positions is a
  function of the canvas (a margin or confidence rule, not a random order) and it draws at temperature 1 without a
  constraint that depends on the canvas (the ids a task's rollouts never draw are out of the scored support too,
  `forbidden_tokens`); `passes_per_forward` = s > 1 scores s consecutive passes from the canvas before the first of them
  (TraceRL's shrinkage: 1/s of the forwards), and s >= the number of passes is the mean-field estimate again.
  The prompt is never masked (the sampler never masks it; `prompt_masked` is ignored, and `rl.prompt_mask_prob` > 0
  with this scorer is refused at start-up). Differs from TraceRL: no value model, and a self-conditioned model is
  scored with its null signal at every pass.
* `AutoregressiveScorer` (AR runs): the exact log-probs of a causal pass, token t read from position t - 1.

Every scorer takes `forbidden_tokens`, the ids the task's rollouts never draw (`tasks.capabilities.RestrictsRolloutTokens`:
Sudoku's non-digits, Countdown's BOS in place and PAD/BOS/MASK left to right): their logits are removed before the
softmax as the sampler removes them before its draw, so a scored token's log-prob is over the sampler's own support
(exactly the sampler's for an AR run drawing at temperature 1).

All return (log-probs, entropies), each (b, l) with zeros outside `completion`, plus the MoE auxiliary outputs; all
take `commit_pass` (b, l) int32, which only the trajectory scorer reads (the others accept None), and `masked` (b, l)
bool, the positions the sampler wrote (None: `completion`): the diffusion scorers mask all of them and score only
`completion` (`rl.stop_at_eos` scores a completion up to its first EOS while the tail after it stays masked, as in
d1's forward_process, so the scored pass never sees where the completion ended); the AR scorer ignores it. All read
position t's prediction from its own logits (the AR scorer: from t - 1, the causal convention); a run trained with
`diffusion.token_shift` is refused before its weights are loaded (`rl.command.check_unshifted_start`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.models import transformer as T


def _scores(
    logits: Float[Array, "b l v"], targets: Int[Array, "b l"], where: Bool[Array, "b l"], removed: tuple[int, ...] = ()
):
    """(log-probs of `targets`, entropies) at `where` (zeros elsewhere), with the ids `removed` taken out of the support."""
    logits = logits.astype(jnp.float32)
    if removed:
        logits = logits.at[..., jnp.asarray(removed)].set(-jnp.inf)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    at = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    probs = jnp.exp(log_probs)
    kept = probs > 0  # a removed id's -inf log-prob stays out of the product, so no 0 * -inf in the backward pass
    entropy = -jnp.sum(jnp.where(kept, probs * jnp.where(kept, log_probs, 0.0), 0.0), axis=-1)
    return jnp.where(where, at, 0.0), jnp.where(where, entropy, 0.0)


def _masked_pass(model, params, tokens, undecided, scored, mask_id: int, null_signal: str, forbidden=()):
    """(log-probs, entropies, aux) at `scored` from one bidirectional pass with `undecided` masked, the mask token and
    `forbidden` out of the support; a self-conditioned model gets its null signal (no earlier pass to condition on, as
    at a sampler's first step)."""
    signal = None
    if model.cfg.self_conditioning:
        signal = T.model_method(model, params, "null_sc_signal", tokens.shape, kind=null_signal)
    logits, aux = T.forward(model, params, jnp.where(undecided, mask_id, tokens), causal=False, sc_signal=signal)
    return *_scores(logits, tokens, scored, (mask_id, *forbidden)), aux


@dataclasses.dataclass(frozen=True)
class MeanFieldScorer:
    """d1's one-step estimator: the completion (with `masked`, every position the sampler wrote) and `prompt_masked`
    masked, one bidirectional pass; the log-probs of `completion`."""

    model: T.Transformer
    mask_id: int
    null_signal: str = "zeros"  # a self-conditioned model's input at its first pass (`diffusion.null_signal`)
    forbidden_tokens: tuple[int, ...] = ()  # ids the rollouts never draw: out of the scored support

    def __call__(
        self,
        params,
        tokens: Int[Array, "b l"],
        completion: Bool[Array, "b l"],
        prompt_masked: Bool[Array, "b l"],
        commit_pass: Int[Array, "b l"] | None = None,
        *,
        masked: Bool[Array, "b l"] | None = None,
    ) -> tuple[Float[Array, "b l"], Float[Array, "b l"], dict]:
        del commit_pass
        undecided = completion | prompt_masked | (completion if masked is None else masked)
        return _masked_pass(
            self.model, params, tokens, undecided, completion, self.mask_id, self.null_signal, self.forbidden_tokens
        )


@dataclasses.dataclass(frozen=True)
class TrajectoryScorer:
    """TraceRL's trajectory-aware log-probs: each completion position scored from the canvas at the pass that
    committed it (`commit_pass`, from 0; grouped `passes_per_forward` at a time); `num_passes` forwards at most."""

    model: T.Transformer
    mask_id: int
    num_passes: int
    passes_per_forward: int = 1
    null_signal: str = "zeros"
    forbidden_tokens: tuple[int, ...] = ()  # ids the rollouts never draw: out of the scored support

    needs_commit_pass = True

    def __post_init__(self):
        if self.num_passes < 1 or self.passes_per_forward < 1:
            raise ValueError(
                f"the trajectory scorer needs num_passes={self.num_passes} >= 1 (the sampler's passes per completion) "
                f"and passes_per_forward={self.passes_per_forward} >= 1 (config.rl.trajectory_passes_per_forward)."
            )

    @property
    def num_forwards(self) -> int:
        return -(-self.num_passes // self.passes_per_forward)

    def __call__(
        self,
        params,
        tokens: Int[Array, "b l"],
        completion: Bool[Array, "b l"],
        prompt_masked: Bool[Array, "b l"],
        commit_pass: Int[Array, "b l"] | None = None,
        *,
        masked: Bool[Array, "b l"] | None = None,
    ) -> tuple[Float[Array, "b l"], Float[Array, "b l"], dict]:
        if commit_pass is None:
            raise ValueError("the trajectory scorer needs each completion position's commit pass from the rollout.")
        del prompt_masked  # the sampler never masks the prompt: scoring it masked would not be its probability
        written = completion if masked is None else masked | completion  # a position here is masked until its pass
        group = jnp.where(written, commit_pass // self.passes_per_forward, -1)

        @jax.checkpoint  # the backward pass recomputes each forward: it holds one forward's activations at a time
        def one_group(params, g):
            undecided = written & (group >= g)
            scored = completion & (group == g)
            return _masked_pass(
                self.model, params, tokens, undecided, scored, self.mask_id, self.null_signal, self.forbidden_tokens
            )

        def body(carry, g):  # a scan, so that the forwards run one after another
            log_probs, entropy = carry
            here, spread, aux = one_group(params, g)
            return (log_probs + here, entropy + spread), aux

        start = (jnp.zeros(tokens.shape, jnp.float32), jnp.zeros(tokens.shape, jnp.float32))
        (log_probs, entropy), aux = jax.lax.scan(body, start, jnp.arange(self.num_forwards))
        aux = jax.tree.map(lambda x: jnp.mean(x, axis=0), aux)
        return log_probs, entropy, aux


@dataclasses.dataclass(frozen=True)
class AutoregressiveScorer:
    """Exact token log-probs of a causal pass over [prompt; completion], over the rollouts' support (the vocabulary
    without `forbidden_tokens`); `prompt_masked` is ignored."""

    model: T.Transformer
    forbidden_tokens: tuple[int, ...] = ()  # ids the rollouts never draw: out of the scored support

    def __call__(
        self,
        params,
        tokens: Int[Array, "b l"],
        completion: Bool[Array, "b l"],
        prompt_masked: Bool[Array, "b l"],
        commit_pass: Int[Array, "b l"] | None = None,
        *,
        masked: Bool[Array, "b l"] | None = None,
    ) -> tuple[Float[Array, "b l"], Float[Array, "b l"], dict]:
        del prompt_masked, commit_pass, masked
        logits, aux = T.forward(self.model, params, tokens, causal=True)
        shifted = jnp.concatenate([jnp.zeros_like(logits[:, :1]), logits[:, :-1]], axis=1)  # position t reads t - 1
        scored = completion & (jnp.arange(tokens.shape[1]) > 0)[None, :]
        log_probs, entropy = _scores(shifted, tokens, scored, self.forbidden_tokens)
        return log_probs, entropy, aux
