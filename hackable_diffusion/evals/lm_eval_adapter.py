"""The lm-evaluation-harness (lm-eval 0.4) model `hackable_diffusion`: any toolbox text run, diffusion or AR.

  python -m hackable_diffusion.evals.harness --model hackable_diffusion \\
      --model_args workdir=runs/quickstart,num_draws=8 --tasks hd_shakespeare_next_line \\
      --include_path hackable_diffusion/evals/lm_eval_tasks

or from Python: `lm_eval.simple_evaluate(model=HackableDiffusionLM(workdir=...), tasks=[...], task_manager=...)`.

Model args: `workdir` (a training workdir or `hf:DIR`), `num_draws` (Monte-Carlo draws per diffusion
log-likelihood, default 8), `seed` (0), `batch_size` (8), `max_length` (0 = the run's training sequence length),
`greedy_check` (true: the greedy flag of a diffusion run costs one sampler decode per request), `weights` (ema: the EMA when the run kept one; raw), and
any `config.<path>=value` of the run's saved config, e.g. `config.sampler.num_steps=16`,
`config.sampler.selection.rule=top_k_top_probability`, `config.sampler.canvas_len=16`,
`config.sampler.min_temperature=0.2`. Log-likelihoods, the rolling bound and generation are `evals.scoring.Scorer`'s
(its module docstring states the estimators). lm-eval's own `gen_kwargs` (`until`, `max_gen_toks`) are honoured; its
sampling kwargs (`temperature`, `do_sample`) are not: generation uses the run's sampler settings, which are set
through the model args above and recorded in the results' `config` block.

A run whose task answers puzzles (`tasks.capabilities.ScoresLmEvalPuzzles`: Sudoku) answers only generation requests
whose context is a puzzle (task `hd_sudoku_solve`), with the answerer the task gives (Sudoku's solver and
`config.solver.*` settings, `tasks/sudoku/lm_eval_requests.py`); the forward passes it spent are in the model info.
Any other run's task must generate text (`tasks.capabilities.GeneratesText`). `request_answerers` makes that choice.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from hackable_diffusion import cli, run_config
from hackable_diffusion import experiment as exp_lib
from hackable_diffusion.checkpoints import hf_runs, toolbox
from hackable_diffusion.evals import scoring
from hackable_diffusion.recipes import sampler_report
from hackable_diffusion.tasks.capabilities import GeneratesText, LmEvalPuzzleAnswerer, ScoresLmEvalPuzzles

_TRUE = ("1", "true", "yes")
# HackableDiffusionLM's own arguments (lm-eval adds batch_size, max_batch_size and device to those of --model_args)
MODEL_ARGS = ("workdir", "num_draws", "seed", "batch_size", "max_length", "greedy_check", "weights")
EXTRA_ARGS = ("max_batch_size", "device")


def check_model_args(model_args: Mapping[str, Any]) -> None:
    """Checks the model args before anything is loaded (the harness calls it before handing over to lm-eval): every
    key is known, `workdir` is a training workdir with its config.json, or `hf:DIR` a Hugging Face checkpoint
    directory, and every `config.<path>` names a key of that run's config. Raises ValueError or FileNotFoundError
    with one line that names what is wrong and how to fix it."""
    bad = [k for k in model_args if k not in MODEL_ARGS + EXTRA_ARGS and not str(k).startswith("config.")]
    if bad:
        raise ValueError(
            f"unknown model args {bad}: use workdir, num_draws, seed, batch_size, max_length, greedy_check, "
            "weights, or config.<path>=value (e.g. config.sampler.num_steps=16)."
        )
    workdir = model_args.get("workdir")
    if not workdir:
        raise ValueError("model_args needs workdir=<a training workdir or hf:DIR>.")
    workdir = str(workdir)
    if workdir.startswith(hf_runs.HF_PREFIX):
        config = hf_runs.hf_experiment_config(workdir[len(hf_runs.HF_PREFIX) :])
    else:
        path = pathlib.Path(workdir)
        if not path.is_dir():
            raise FileNotFoundError(
                f"model_args workdir={workdir}: no such directory; pass a training workdir (the --workdir of python -m "
                "hackable_diffusion.train or sft) or hf:DIR for a Hugging Face checkpoint directory."
            )
        config = run_config.load_saved_config(workdir)
    cli.check_overrides(config, [f"--{k}=" for k in model_args if str(k).startswith("config.")])


def _bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in _TRUE


def request_answerers(
    exp: Any,
    params: Any,
    *,
    seed: int = 0,
    batch_size: int = 8,
    num_draws: int = 8,
    max_length: int = 0,
    greedy_check: bool = True,
) -> tuple[scoring.Scorer | None, LmEvalPuzzleAnswerer | None]:
    """(text scorer, puzzle answerer) of a run, exactly one of them set: the task's puzzle answerer when it has
    `ScoresLmEvalPuzzles` (at least 64 puzzles a solver batch), else the text `scoring.Scorer` when it has
    `GeneratesText`; a one-line ValueError naming both capabilities when it has neither."""
    if isinstance(exp.task, ScoresLmEvalPuzzles):
        return None, exp.task.lm_eval_puzzle_answerer(exp, params, seed=seed, batch_size=max(batch_size, 64))
    if not isinstance(exp.task, GeneratesText):
        raise ValueError(
            "the lm-eval adapter answers runs whose task has the GeneratesText capability (text requests) or "
            f"ScoresLmEvalPuzzles (puzzle requests) of hackable_diffusion.tasks.capabilities; the {exp.task.name!r} "
            "task has neither."
        )
    scorer = scoring.Scorer(
        exp,
        params,
        num_draws=num_draws,
        seed=seed,
        batch_size=batch_size,
        max_length=max_length,
        greedy_check=greedy_check,
    )
    return scorer, None


@register_model("hackable_diffusion")
class HackableDiffusionLM(LM):
    def __init__(
        self,
        workdir: str | None = None,
        num_draws: int = 8,
        seed: int = 0,
        batch_size: int | str = 8,
        max_length: int = 0,
        greedy_check: bool | str = True,
        weights: str = "ema",
        max_batch_size: Any = None,
        device: Any = None,
        **config_overrides: Any,
    ):
        super().__init__()
        del max_batch_size, device  # one process, the default JAX device(s)
        check_model_args(dict(config_overrides, workdir=workdir))
        workdir = hf_runs.resolve_workdir(str(workdir))
        overrides = [f"--{k}={v}" for k, v in config_overrides.items()]
        config = cli.parse_config_overrides(run_config.load_saved_config(workdir), overrides)
        exp = exp_lib.build(config, workdir, inference=True)
        params, self.checkpoint_step = toolbox.load_params(exp, workdir, weights=str(weights))
        size = 8 if str(batch_size).startswith("auto") else int(batch_size)
        self.workdir = workdir
        self.scorer, self.puzzles = request_answerers(
            exp,
            params,
            seed=int(seed),
            batch_size=size,
            num_draws=int(num_draws),
            max_length=int(max_length),
            greedy_check=_bool(greedy_check),
        )

    def _text_scorer(self) -> scoring.Scorer:
        if self.scorer is None:
            raise ValueError(
                f"a {self.puzzles.exp.task.name!r} run answers only generation requests whose context is a puzzle "
                "(its task has ScoresLmEvalPuzzles, e.g. the lm-eval task hd_sudoku_solve); log-likelihood tasks need "
                "a text run."
            )
        return self.scorer

    # -- lm-eval's interface ------------------------------------------------------------------------------------------

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self._text_scorer()
        pairs = []
        for request in requests:
            context, continuation = request.args
            # lm-eval puts the separating space at the start of the continuation; tokenise the two parts apart so that
            # the continuation's tokens are exactly its own.
            pairs.append((self.scorer.encode(context), self.scorer.encode(continuation)))
        with tqdm(total=len(pairs), disable=disable_tqdm, desc="loglikelihood") as bar:
            scores = self.scorer.loglikelihood(pairs, progress=bar.update)
        return [(s.logprob, s.is_greedy) for s in scores]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        self._text_scorer()
        documents = [self.scorer.encode(request.args[0]) for request in requests]
        with tqdm(total=len(documents), disable=disable_tqdm, desc="loglikelihood_rolling") as bar:
            scores = self.scorer.loglikelihood_rolling(documents, progress=None)
            bar.update(len(documents))
        return [s.logprob for s in scores]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        if self.puzzles is not None:
            with tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until (puzzles)") as bar:
                return self.puzzles([request.args[0] for request in requests], progress=bar.update)
        groups: dict[tuple[tuple[str, ...], int], list[int]] = {}
        contexts = []
        for i, request in enumerate(requests):
            context, gen_kwargs = request.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.get("until") or []
            until = (until,) if isinstance(until, str) else tuple(until)
            max_new = int(gen_kwargs.get("max_gen_toks") or self.scorer.exp.config.sampler.max_new_tokens)
            groups.setdefault((until, max_new), []).append(i)
            contexts.append(self.scorer.encode(context))
        out = [""] * len(requests)
        with tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until") as bar:
            for (until, max_new), members in groups.items():  # requests that share stop strings and length
                generated = self.scorer.generate(
                    [contexts[i] for i in members], max_new_tokens=max_new, progress=bar.update
                )
                for i, ids in zip(members, generated):
                    out[i] = cut_at_stop(self.scorer.exp.tokenizer.decode(ids), list(until))
        return out

    def get_model_info(self) -> dict[str, Any]:
        if self.puzzles is not None:
            c = self.puzzles.exp.config
            return {
                "workdir": self.workdir,
                "checkpoint_step": self.checkpoint_step,
                "kind": f"{self.puzzles.exp.task.name}/{c.diffusion.process}",
                "loglikelihood": "none (the task's puzzle solver)",
                "seed": self.puzzles.seed,
                **self.puzzles.info(),
            }
        c = self.scorer.exp.config
        info = {
            "workdir": self.workdir,
            "checkpoint_step": self.checkpoint_step,
            "kind": "autoregressive" if self.scorer.is_autoregressive else f"diffusion/{c.diffusion.process}",
            "loglikelihood": "exact" if self.scorer.is_autoregressive else f"ELBO bound, {self.scorer.num_draws} draws",
            "seed": self.scorer.seed,
            "max_length": self.scorer.sequence_length,
        }
        if not self.scorer.is_autoregressive:
            s = c.sampler
            info["sampler"] = {
                "num_steps": s.num_steps,
                "canvas_len": s.canvas_len,
                "selection": dict(s.selection),
                "temperature": [s.min_temperature, s.max_temperature],
                "early_stopping": sampler_report(c)["early_stopping"],
            }
        else:
            info["sampler"] = {"ar_temperature": c.sampler.ar_temperature}
        return info


def cut_at_stop(text: str, until: list[str]) -> str:
    """The text up to the earliest of the stop strings (all of it when none occurs)."""
    end = len(text)
    for stop in until:
        if stop and stop in text:
            end = min(end, text.index(stop))
    return text[:end]
