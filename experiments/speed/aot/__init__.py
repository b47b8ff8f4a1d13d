"""Ahead-of-time compilation of the toolbox's programs on a (simulated) device mesh, with a per-device memory report.

Follows the JAX AOT recipe (`jax.jit(f, in_shardings, out_shardings).lower(*abstract).compile()` on
`jax.ShapeDtypeStruct`s carrying `NamedSharding`s) and an fsdp x expert layout in the style of MaxText / GShard
expert parallelism: every parameter is placed by the logical-axis rules of `training/sharding.py` (expert weights
over the `expert` mesh axis -- asserted -- and over `fsdp` in their embed dimension). Nothing is allocated: the
parameters, optimizer state, batches and KV caches are abstract, so the 26B model compiles in under 2 GB of RSS.

Programs (each reported as one JSON-able dict, after a `params` line):
  train_adamw, train_adafactor  the full train step of `train_state.make_train_step` (loss, grads, global-norm clip,
                                optimizer update, non-finite guard), state donated. Loss: `AutoregressiveObjective`
                                (next-token CE, causal), or `--objective block_diffusion` for
                                `DiffusionPretrainObjective` (canvas 256, masking, canvas CE + encoder AR loss).
  canvas_denoise                `transformer.decode_block`: a canvas (batch 1 x 256) attends to itself and to a
                                4096-slot KV cache, cache read only (the sampler's inner step), with self-conditioning.
  append                        `transformer.append` of 256 committed tokens into the cache (cache donated).
  decode_1                      the same for one token (causal decoding).

Figures: per-device bytes from `compiled.memory_analysis()` (arguments, outputs, aliases, temporaries, code) and the
analytic per-device bytes of parameters / optimizer state / cache from the shardings (`shard_shape`), which must
match the compiled argument size. The summary line converts them into 80 GB GPUs under stated assumptions.

Deliberate choices and caveats (each JSON line says which were used):
  * Params are bf16 (the preset's param_dtype) with NO f32 master copy; the optimizer state follows the parameter
    dtype (optax's default): AdamW's mu/nu are bf16 and sharded like the params, Adafactor's factored row/column
    moments are bf16 and replicated (about 90 MB).
    `--param_dtype float32` compiles the f32-master-weight variant.
  * MoE dispatch: the preset's "ragged" (dropless `jax.lax.ragged_dot`, the GPU path) by default. XLA:CPU lowers
    ragged_dot to a masked dense dot over every local expert, so CPU temporaries of "ragged" overstate a GPU's
    grouped GEMM; `--dispatch sorted` (capacity buffers) is closer to what the GPU allocates.
  * `--licm off` (default) disables XLA's while-loop-invariant-code-motion for these programs: on CPU that pass hoists
    an f32 convert of every scanned bf16 weight stack out of the layer loop (an f32 copy of all layer weights, e.g.
    +15 GiB per device for canvas_denoise), an artifact of XLA:CPU's bf16 dot handling that the GPU does not have.
  * Layout: the toolbox's batch sharding is over (data, fsdp); the model has no activation sharding constraints, and
    GSPMD then gives the residual stream the embedding table's layout (embed dim over fsdp, batch replicated on every
    device). `--layout toolbox --batch_axes data,fsdp` compiles exactly that; `--layout constrained` (default) adds one
    `with_sharding_constraint` on the token embeddings (batch over `--batch_axes`), which the layers then follow.
  * Layers are `nn.scan`ned over repeats of the 6-layer pattern, so the HLO holds ONE layer group whatever the depth;
    depth only changes the leading `layers` axis of the stacked weights, the caches and the saved residuals, and
    compile time does not grow with it. Parameter, optimizer and cache bytes are exactly affine in depth,
    bytes(G) = fixed + G * per_group (the `params` line gives both); `--num_layers 6` compiles one full-width group.

`layout.py` holds the settings, the sharded abstract state and the byte bookkeeping; `programs.py` compiles the
programs and summarises them (`run`). `experiments/speed/aot_26b.py` is the command line for the 26B-A4B model.

The decode programs' cost model is `costs.py` (analytic FLOP and byte counts), `roofline.py` (step times on published
GPU peaks) and `xla_counts.py` (XLA's counts of the compiled programs); `experiments/speed/gpu_cost_model.py` runs it.
"""
