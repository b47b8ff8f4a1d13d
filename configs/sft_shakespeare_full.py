"""Full fine-tuning SFT on tiny Shakespeare line pairs from the quickstart run (every weight trained).

  python -m hackable_diffusion.sft --config configs/sft_shakespeare_full.py --workdir runs/sft_full

The same task and objective as configs/sft_shakespeare_lora.py with `lora.rank = 0` and a lower learning rate.
"""

from hackable_diffusion import sft


def get_config():
    return sft.sft_config(
        init_kind="toolbox",
        checkpoint="runs/quickstart",
        lora_rank=0,
        steps=300,
        batch_size=8,
        prompt_len=64,
        num_canvases=2,
        canvas_len=32,
    )
