"""LoRA SFT on tiny Shakespeare line pairs (prompt = a line, response = the next two lines) from the quickstart run.

  python -m hackable_diffusion.train --config configs/quickstart.py --workdir runs/quickstart    # the base model
  python -m hackable_diffusion.sft --config configs/sft_shakespeare_lora.py --workdir runs/sft_lora

DiffusionGemma's SFT recipe (docs/reference.md §3): canvas cross-entropy on one uniformly corrupted
canvas + the encoder's AR loss, self-conditioning, adapters of rank 8 on every linear map except the experts, with
alpha / rank = 2 (the reference has no alpha). Start from a converted Gemma-4 tree instead with
`--config.init.kind=gemma --config.init.checkpoint=DIR` (shaped by config.model), or fine-tune fully with
`--config.lora.rank=0` (see configs/sft_shakespeare_full.py). Writes runs/sft_lora/fused_params (orbax, toolbox layout).
"""

from hackable_diffusion import sft


def get_config():
    c = sft.sft_config(
        init_kind="toolbox",
        checkpoint="runs/quickstart",
        lora_rank=8,
        lora_alpha=16.0,
        steps=300,
        batch_size=8,
        prompt_len=64,
        num_canvases=2,
        canvas_len=32,
    )
    c.lora.include_experts = False  # True also adapts every MoE expert (the reference never does)
    return c
