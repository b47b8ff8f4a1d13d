"""A toy language model and data pipeline for the training-infrastructure tests, runnable as a worker script.

Imported by the tests in tests/training/ (toy model, logical axes, data) and run as a subprocess for the SIGKILL-resume
and 2-process tests:

  python tests/training/_toy_train_worker.py --workdir W --total_steps 8 --out W/result.npz
      [--kill_at_step 6 --kill_after_checkpoint 3] [--mesh 2,1,1,2] [--resume_to 5] [--step_sleep 0.2]
      [--coordinator 127.0.0.1:PORT --num_processes 2 --process_id 0]

Device count comes from XLA_FLAGS (set by the test). The model: token embedding + a 2-expert "MoE" residual block
(every token uses both experts, averaged) + a linear head; next-token cross-entropy on a noisy affine Markov chain,
weighted per example (a NaN weight poisons one batch on purpose).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

VOCAB, DIM, HIDDEN, EXPERTS, SEQ = 16, 8, 8, 2, 8
GLOBAL_BATCH = 8
#: XLA backend optimisation level 0 compiles the toy train step ~2.5x faster on CPU; results stay IEEE float32.
FAST_COMPILE = {"xla_backend_optimization_level": 0}

_LOGICAL_AXES = {
    ("embed",): ("vocab", "embed"),
    ("experts", "w_in"): ("experts", "embed", "expert_mlp"),
    ("experts", "w_out"): ("experts", "expert_mlp", "embed"),
    ("out", "kernel"): ("embed", "vocab"),
    ("out", "bias"): ("vocab",),
}


def _uniform(key, shape, scale):
    # Uniform rather than normal draws: normal's erf_inv makes every compile ~0.4 s slower on CPU.
    return scale * jax.random.uniform(key, shape, minval=-1.0, maxval=1.0)


def init_fn(key):
    k_embed, k_in, k_out, k_head = jax.random.split(key, 4)
    return {
        "embed": _uniform(k_embed, (VOCAB, DIM), 1.0),
        "experts": {
            "w_in": _uniform(k_in, (EXPERTS, DIM, HIDDEN), np.sqrt(3.0 / DIM)),
            "w_out": _uniform(k_out, (EXPERTS, HIDDEN, DIM), np.sqrt(3.0 / HIDDEN)),
        },
        "out": {"kernel": _uniform(k_head, (DIM, VOCAB), np.sqrt(3.0 / DIM)), "bias": jnp.zeros((VOCAB,))},
    }


def logical_axes_fn(path, shape):
    return _LOGICAL_AXES.get(tuple(path))


def make_loss_fn(noise: float = 0.05):
    """Next-token CE; `noise` > 0 adds key-dependent uniform noise to the hidden state (exercises the step rng)."""

    def loss_fn(params, batch, key):
        tokens = batch["tokens"]  # (b, l)
        h = params["embed"][tokens[:, :-1]]  # (b, l-1, d)
        if noise:
            h = h + _uniform(key, h.shape, noise)
        e = jax.nn.gelu(jnp.einsum("bld,edh->bleh", h, params["experts"]["w_in"]))
        h = h + jnp.einsum("bleh,ehd->bld", e, params["experts"]["w_out"]) / EXPERTS
        logits = h @ params["out"]["kernel"] + params["out"]["bias"]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(-1)  # (b,)
        loss = jnp.mean(ce * batch["weight"])
        return loss, {"ce": jnp.mean(ce)}

    return loss_fn


def make_records(num_examples: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(num_examples):
        x = np.empty(SEQ, np.int32)
        x[0] = rng.integers(VOCAB)
        for t in range(1, SEQ):
            x[t] = (3 * x[t - 1] + 1) % VOCAB if rng.random() < 0.8 else rng.integers(VOCAB)
        records.append({"tokens": x, "weight": np.float32(1.0)})
    return records


def make_dataset(
    process_index: int = 0, process_count: int = 1, nan_at_batch: int | None = None, global_batch: int = GLOBAL_BATCH
):
    """Global batches of the toy stream (endless), this process's contiguous rows of each, as a grain MapDataset."""
    local = global_batch // process_count

    def select(index, batch):
        batch = {k: v[process_index * local : (process_index + 1) * local] for k, v in batch.items()}
        if nan_at_batch is not None and index == nan_at_batch:
            batch["weight"] = np.full_like(batch["weight"], np.nan)
        return batch

    return (
        grain.MapDataset.source(make_records())
        .seed(0)
        .shuffle()
        .batch(global_batch, drop_remainder=True)
        .repeat()
        .map_with_index(select)
    )


def make_iterator(**kwargs):
    return iter(make_dataset(**kwargs).to_iter_dataset())


def optimizer_cfg(total_steps: int, **overrides) -> ml_collections.ConfigDict:
    cfg = ml_collections.ConfigDict(
        dict(
            name="adamw",
            peak_lr=3e-2,
            end_lr=3e-3,
            warmup_steps=2,
            total_steps=total_steps,
            weight_decay=0.01,
            b1=0.9,
            b2=0.99,
            eps=1e-8,
            clip_norm=1.0,
        )
    )
    cfg.update(overrides)
    return cfg


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--total_steps", type=int, required=True)
    parser.add_argument(
        "--resume_to",
        type=int,
        default=0,
        help="after training to total_steps, call train() again (restoring) up to this step",
    )
    parser.add_argument("--checkpoint_every", type=int, default=3)
    parser.add_argument("--kill_at_step", type=int, default=0)
    parser.add_argument("--kill_after_checkpoint", type=int, default=0)
    parser.add_argument("--mesh", default="1,1,1,1")
    parser.add_argument("--coordinator", default=None)
    parser.add_argument("--num_processes", type=int, default=None)
    parser.add_argument("--process_id", type=int, default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--step_sleep", type=float, default=0.0, help="seconds to sleep after each step (signal tests)")
    args = parser.parse_args(argv)

    from hackable_diffusion.training import distributed

    distributed.maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id, timeout_s=20)

    from jax.experimental import multihost_utils

    from hackable_diffusion.training import loop, sharding

    data, fsdp, expert, tensor = (int(s) for s in args.mesh.split(","))
    mesh = sharding.make_mesh(dict(data=data, fsdp=fsdp, expert=expert, tensor=tensor))
    hooks = []
    if args.kill_at_step:
        marker = os.path.join(args.workdir, "checkpoints", str(args.kill_after_checkpoint))

        def kill(step, state, metrics):
            if step == args.kill_at_step:
                deadline = time.time() + 60
                while not os.path.isdir(marker) and time.time() < deadline:
                    time.sleep(0.02)
                print(f"killing myself at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        hooks.append(kill)
    if args.step_sleep:
        hooks.append(lambda step, state, metrics: time.sleep(args.step_sleep))
    schedule_steps = max(args.total_steps, args.resume_to)
    for total_steps in (args.total_steps, args.resume_to) if args.resume_to else (args.total_steps,):
        try:
            state = loop.train(
                workdir=args.workdir,
                init_fn=init_fn,
                loss_fn=make_loss_fn(),
                train_iterator=make_iterator(process_index=jax.process_index(), process_count=jax.process_count()),
                loop=loop.LoopConfig(
                    total_steps=total_steps,
                    seed=0,
                    ema_decay=0.9,
                    log_every=1,
                    checkpoint_every=args.checkpoint_every,
                    keep_checkpoints=2,
                ),
                optimizer_cfg=optimizer_cfg(schedule_steps),
                mesh=mesh,
                param_logical_axes_fn=logical_axes_fn,
                hooks=hooks,
                compiler_options=FAST_COMPILE,
            )
        except loop.TrainingInterrupted as err:
            print(f"interrupted: {err}", flush=True)
            return err.exit_code
    tree = {"params": state.params, "ema": state.ema_params}
    if jax.process_count() > 1:
        tree = multihost_utils.process_allgather(tree, tiled=True)
    flat = {
        "/".join(sharding.path_to_names(p)): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    if args.out and jax.process_index() == 0:
        np.savez(args.out, **flat)
    print(f"done at step {int(state.step.addressable_data(0))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
