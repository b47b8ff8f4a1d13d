"""The text task (`config.data.task="text"`): `tasks.Task` for packed text corpora, and the `GeneratesText` capability.

Its scores and generation are in `text.py`, what `evaluate` runs on a text run in `text_evaluation.py`, and the SFT
example pairs of a fine-tuning run (`python -m hackable_diffusion.sft`) in `text_sft.py`; this module only ties them
to the protocol, so that each of them imports the others at module level.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import TYPE_CHECKING

import jax
import ml_collections

from hackable_diffusion import recipes
from hackable_diffusion.data import text as text_lib
from hackable_diffusion.tasks import text_evaluation, text_sft
from hackable_diffusion.tasks.text import evaluate_likelihood, generate_tokens, is_sft, sample_texts

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment
    from hackable_diffusion.sampling.generate import GenerationResult


@dataclasses.dataclass(frozen=True)
class TextTask:
    """`tasks.Task` for packed text corpora (`config.data`: corpus, tokenizer, vocab_size, seq_len, data_dir)."""

    name: str = "text"

    def check_config(self, config: ml_collections.ConfigDict) -> None:
        d = config.data
        text_lib.check_corpus(d.corpus, d.tokenizer, d.data_dir or None)
        if not 0.0 < d.get("train_fraction", 1.0) <= 1.0:
            raise ValueError(
                f"data.train_fraction must be in (0, 1] (the leading share of the training split to train on), got "
                f"{d.train_fraction}."
            )

    def upgrade_saved_config(self, config: ml_collections.ConfigDict) -> None:
        pass  # no task-specific keys have changed (a run saved before `data.train_fraction` reads as 1.0)

    def build_data(self, config: ml_collections.ConfigDict, workdir: str):
        if is_sft(config):  # prompt -> response examples (tasks/text_sft.py)
            return text_sft.build_sft_data(config, workdir)
        d = config.data
        return text_lib.build_text_data(
            d.corpus,
            d.tokenizer,
            d.vocab_size or None,
            d.seq_len,
            workdir,
            data_dir=d.data_dir or None,
            train_fraction=d.get("train_fraction", 1.0),
        )

    def adapt_objective(self, config, model, objective):
        return objective

    def train_iterator(self, exp: Experiment, process_index: int, process_count: int):
        if is_sft(exp.config):
            batch, seed = exp.config.data.batch_size, exp.config.seed
            return text_sft.make_example_iterator(exp.data.train_examples, batch, seed, process_index, process_count)
        return text_lib.make_train_iterator(
            exp.data.train_sequences,
            exp.config.data.batch_size,
            exp.config.seed,
            process_index=process_index,
            process_count=process_count,
        )

    def eval_fn(self, exp: Experiment, workdir: str):
        config = exp.config
        if is_sft(config):
            return text_sft.sft_eval_fn(exp)

        def evaluate(params, ema_params):
            use = ema_params if ema_params is not None else params
            out = evaluate_likelihood(exp, use, num_batches=config.eval.num_batches)
            if config.eval.num_samples and jax.process_count() == 1:
                prompts = [config.sampler.prompt] * config.eval.num_samples
                texts, result = sample_texts(exp, use, prompts, seed=config.seed)
                out["sample_forward_passes"] = result.forward_passes
                with open(pathlib.Path(workdir) / "samples.txt", "a") as f:
                    f.write("--- eval samples ---\n" + "".join(f"{config.sampler.prompt}{t}\n" for t in texts))
                print("eval sample: " + repr(config.sampler.prompt + texts[0][:200]), flush=True)
            return {k: v for k, v in out.items() if isinstance(v, (int, float))}

        return evaluate

    def report(self, exp: Experiment, params) -> str:
        config = exp.config
        texts, result = sample_texts(exp, params, [config.sampler.prompt], seed=config.seed)
        kind = "autoregressive" if exp.is_autoregressive else f"diffusion ({config.sampler.selection.rule})"
        return f"Sample ({kind}, {result.forward_passes} forward passes):\n{config.sampler.prompt}{texts[0]}"

    def default_config(self) -> ml_collections.ConfigDict:
        return recipes.base_config()

    def define_evaluation_flags(self, flag_values) -> None:
        text_evaluation.define_flags(flag_values)

    def evaluation_from_flags(self, flag_values):
        return text_evaluation.from_flags(flag_values)

    # -- capabilities (tasks/capabilities.py) -----------------------------------------------------------------------
    def generate_tokens(
        self, exp: Experiment, params, prompts, *, key, max_new_tokens: int, prompt_mask=None, return_trajectory=False
    ) -> GenerationResult:
        """`GeneratesText`: `text.generate_tokens`, the run's own decoding after token-id prompts."""
        return generate_tokens(
            exp,
            params,
            prompts,
            key=key,
            max_new_tokens=max_new_tokens,
            prompt_mask=prompt_mask,
            return_trajectory=return_trajectory,
        )
