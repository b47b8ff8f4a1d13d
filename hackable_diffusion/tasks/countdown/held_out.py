"""A Countdown run's scores on problems it did not train on: answered with the run's sampler and checked by the exact
verifier (`evaluate_problems`, what `evaluate` reports and `held_out_scores` summarises during training), and the
held-out loss (`held_out_loss`). Shared by the task (`task.py`: its training-time evaluation and report) and the
evaluate command (`evaluation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hackable_diffusion.tasks.countdown import data as data_lib
from hackable_diffusion.tasks.countdown import rewards
from hackable_diffusion.tasks.countdown.inference import solve_problems_timed
from hackable_diffusion.tasks.countdown.problems import CountdownProblems

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


def held_out_scores(exp: Experiment, params, num_problems: int) -> dict[str, float]:
    """The exact-answer rate (overall and by label) on the first `num_problems` of the run's held-out set."""
    problems = exp.data.eval_problems.subset(np.arange(min(num_problems, len(exp.data.eval_problems))))
    out = evaluate_problems(exp, params, problems, seed=exp.config.seed, batch_size=exp.config.eval.batch_size)
    keys = [k for k in out if k.startswith(("accuracy", "count"))] + ["forward_passes_per_problem"]
    return {f"countdown_{k}": out[k] for k in keys}


def evaluate_problems(
    exp: Experiment,
    params,
    problems: CountdownProblems,
    *,
    seed: int = 0,
    batch_size: int = 256,
    config: ml_collections.ConfigDict | None = None,
    num_examples: int = 3,
) -> dict[str, Any]:
    """Exact-answer rate overall and by label, forward passes per problem, problems per second (after one compile
    batch), and the first `num_examples` problems with their answers; `config` (default: the run's) holds the
    sampler settings."""
    config = config or exp.config
    prompts = data_lib.prompt_rows(problems, int(config.data.prompt_len))
    solution = solve_problems_timed(exp, params, prompts, seed=seed, batch_size=batch_size, config=config, warm_up=True)
    correct = rewards.row_rewards(prompts, solution.completions) > 0
    out: dict[str, Any] = rewards.accuracy_by_label(correct, problems.labels)
    out["forward_passes_per_problem"] = float(solution.forward_passes.mean())
    out["problems_per_second"] = float(len(problems) / max(solution.seconds, 1e-9))
    out["solve_seconds"] = solution.seconds
    vocab = exp.tokenizer
    out["examples"] = [
        {
            "prompt": vocab.decode(prompts[i]),
            "answer": vocab.decode(solution.completions[i]),
            "reference": str(problems.solutions[i]),
            "correct": bool(correct[i]),
        }
        for i in range(min(num_examples, len(problems)))
    ]
    return out


def held_out_loss(
    exp: Experiment, params, *, num_batches: int | None = None, seed: int = 0, batch_size: int | None = None
) -> dict[str, float]:
    """The training loss and its likelihood metric on the held-out rows (masking: the ELBO in bits per completion
    token, PAD tail included; AR: the NLL in bits per answer token with its EOS), averaged over batches."""
    batch_size = min(batch_size or exp.config.eval.batch_size, len(exp.data.eval_problems))
    d = exp.config.data
    tokens, fixed = data_lib.training_rows(exp.data.eval_problems, int(d.prompt_len), int(d.completion_len))
    metric = exp.objective.loss.likelihood_metric
    fn = jax.jit(exp.objective)
    starts = list(range(0, len(tokens) - batch_size + 1, batch_size))
    losses, bits = [], []
    for i, start in enumerate(starts[:num_batches] if num_batches else starts):
        rows = slice(start, start + batch_size)
        batch = {"tokens": jnp.asarray(tokens[rows]), "fixed": jnp.asarray(fixed[rows])}
        loss, metrics = fn(params, batch, jax.random.key(seed * 100003 + i))
        losses.append(float(loss))
        bits.append(float(metrics[metric]))
    return {"held_out_loss": float(np.mean(losses)), f"held_out_{metric}": float(np.mean(bits))}
