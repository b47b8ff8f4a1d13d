"""Config builders of the Countdown task (configs/countdown.py, configs/countdown_ar.py).

`countdown_config` holds every Countdown key: the rows (`data.prompt_len` + `data.completion_len` = `data.seq_len`),
the difficulty knobs of the generated problems (`data.num_numbers`, `number_min/max`, `target_min/max`,
`allow_division`, `use_all_numbers`), the layout (`diffusion.process`: "masking" in place or "none" for the
autoregressive baseline) and the sampler (`sampler.num_steps` passes of top-probability margin in place; greedy
decoding for AR).
"""

from __future__ import annotations

from typing import Any

import ml_collections

from hackable_diffusion import recipes
from hackable_diffusion.models import presets

PROMPT_LEN = 20  # "100,100,100,100=1000" is 20 tokens: 4 numbers up to 100 and a target up to 1000
COMPLETION_LEN = 24  # the longest 4-number answer with 3-digit numbers is 19 tokens, + EOS


def countdown_model(vocab_size: int = 22) -> dict[str, Any]:
    """The backbone of the Sudoku recipe without its grid prior: 6 global layers, d 256, 8 heads of 32, dense
    gated-GELU FFN of 640, full RoPE, float32; about 4.5M parameters. Bidirectional or causal is the objective's
    choice (in place: bidirectional; AR: causal)."""
    return presets.puzzle(vocab_size, PROMPT_LEN + COMPLETION_LEN)


def countdown_config(
    *,
    model: dict[str, Any] | None = None,
    layout: str = "in_place",
    steps: int = 3000,
    batch_size: int = 64,
    num_train: int = 100_000,
) -> ml_collections.ConfigDict:
    """Countdown on generated problems (`problems.generate_problems`, cached): masking diffusion in place over
    [prompt; completion] with the prompt fixed ("in_place"), or the same backbone causal with the loss on the
    completion ("ar"); unweighted masked CE (in place), lr 2e-3 -> 1e-4 after 100 warm-up steps, EMA 0.999."""
    if layout not in ("in_place", "ar"):
        raise ValueError(f"layout={layout!r} must be 'in_place' or 'ar'.")
    c = recipes.base_config()
    c.model = ml_collections.ConfigDict(model or countdown_model())
    c.data.task = "countdown"
    c.data.corpus = ""
    c.data.tokenizer = ""
    c.data.prompt_len = PROMPT_LEN
    c.data.completion_len = COMPLETION_LEN
    c.data.seq_len = PROMPT_LEN + COMPLETION_LEN
    c.data.batch_size = batch_size
    c.data.num_train = num_train
    c.data.num_eval = 512  # held-out generated problems (another generator seed), minus any in the training set
    c.data.num_numbers = (3, 4)
    c.data.number_min, c.data.number_max = 1, 99
    c.data.target_min, c.data.target_max = 1, 99  # 1-999 fits the rows too (see configs/countdown.py)
    c.data.allow_division = True
    c.data.use_all_numbers = True  # targets reachable with every number (answers may still use fewer)
    c.data.generator_seed = 0
    c.data.cache_dir = ""  # "" = $HACKABLE_DIFFUSION_CACHE or ~/.cache/hackable_diffusion
    c.diffusion.process = "masking" if layout == "in_place" else "none"
    c.diffusion.objective = "pretrain" if layout == "in_place" else "ar"
    c.diffusion.canvas_len = 0
    c.diffusion.loss = "masked_ce"  # unweighted CE over the masked completion positions, pooled over the batch
    c.diffusion.excluded_ids = ()
    c.optimizer.peak_lr = 2e-3
    c.optimizer.end_lr = 1e-4
    c.optimizer.warmup_steps = 100
    c.train.num_steps = steps
    c.train.ema_decay = 0.999  # evaluation and sampling use the EMA weights
    c.train.log_every = 50
    c.train.eval_every = 500
    c.train.checkpoint_every = 500
    c.eval.num_batches = 2
    c.eval.batch_size = 128
    c.eval.num_samples = 0
    c.eval.num_problems = 256  # held-out problems answered at each evaluation
    c.sampler.selection = recipes.selection("top_k_margin")  # Kim et al. 2025: top-probability margin
    c.sampler.early_stopping = recipes.early_stopping("none")  # a row stops when nothing is masked
    c.sampler.num_steps = COMPLETION_LEN  # one completion token per pass
    c.sampler.canvas_len = PROMPT_LEN + COMPLETION_LEN
    c.sampler.min_temperature = 0.1
    c.sampler.max_temperature = 0.1
    c.sampler.score_temperature = 1.0  # rank by the model's own probabilities, as configs/sudoku.py
    c.sampler.prompt = ""
    c.sampler.ar_temperature = 0.0  # AR layout: greedy
    return c
