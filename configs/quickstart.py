"""Quickstart: block masked diffusion on tiny Shakespeare, small enough to train and sample in minutes on a CPU.

  python -m hackable_diffusion.train --config configs/quickstart.py --workdir runs/quickstart

A 1.37M-parameter Gemma-4-style MoE model; canvases of 32 characters, each denoised bidirectionally against the causal
encoder's KV cache of the clean canvases before it (BD3-LM / DiffusionGemma structure); MD4/MDLM ELBO; sampled with
the entropy-bound rule (EB-Sampler / DiffusionGemma), canvas after canvas.

Masking rather than DiffusionGemma's uniform noise: the uniform sampler re-randomises every position it does not
accept, and a model this small accepts few, so minutes of training leave its samples mostly noise.
`configs/quickstart.py:uniform` is the same model with DiffusionGemma's uniform recipe (the few-step distillation
study trains it 5x longer, results/text/README.md).
"""

from hackable_diffusion import recipes


def get_config(process: str = "masking"):
    return recipes.quickstart_config(process or "masking")
