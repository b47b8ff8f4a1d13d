"""Every checkpoint format and how weights get into a run.

| module | what it reads and writes |
|---|---|
| `trees` | flat `{"a/b/c": leaf}` views of nested parameter trees, orbax tree metadata |
| `gemma` | the gemma library's Gemma-4 / DiffusionGemma parameter tree (orbax directories) |
| `hf`, `hf_config`, `hf_mapping`, `hf_files` | Hugging Face directories (safetensors, config.json, generation_config.json) of transformers' DiffusionGemma and Gemma-4 |
| `toolbox` | the toolbox's own runs (orbax train-state steps) and bare params directories |
| `quantized_formats` | quantized Hugging Face directories (ModelOpt NVFP4, FP8 compressed-tensors), dequantized for `hf` |
| `quantized_runs` | runs quantized to FP8 or NVFP4 by `python -m hackable_diffusion.quantize` |
| `hf_runs` | a Hugging Face directory used as a run (`--workdir hf:DIR`) |
| `base_weights` | the weights a run starts from (`config.init`) and how they enter the new model |
| `weight_matching` | the strict matching of those weights onto the new model, and its report (`init_report.json`) |

`models/` holds the network alone; nothing there reads or writes files.
"""
