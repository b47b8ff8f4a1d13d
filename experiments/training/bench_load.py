"""Loading a Hugging Face checkpoint: peak host memory and speed of the naive and the sharded path.

  python experiments/training/bench_load.py [--gb 2] [--devices 8] [--dir /tmp/hd_bench_ckpt]

Writes a random DiffusionGemma-layout checkpoint of about `--gb` GB with the toolbox's own exporter
(`hf_ckpt.save_hf`, bf16 weights), then loads it in a fresh process per path, on `--devices` simulated CPU devices:

- `naive`: every tensor read into host numpy (`load_hf` without a mesh), then placed on the mesh with `device_put`;
  host memory holds the model in numpy and again in the device buffers.
- `sharded`: `load_hf(mesh=...)`: every leaf built with `make_array_from_callback`, each device's slice read from the
  files, one layer's tensor at a time.

The mesh is fsdp x `--devices` (the toolbox's logical-axis rules shard every matrix over fsdp; norms are replicated).

Prints one JSON line per path: `peak_rss_over_checkpoint` = (peak resident memory of the process - its resident
memory before loading) / checkpoint bytes, `peak_rss_over_device_bytes` the same over what the devices hold (more than
the checkpoint where leaves are replicated), the raw figures, the wall time and `gb_per_s` (checkpoint bytes / wall).
On a CPU the devices' buffers are host memory too, so 1.0 of the device bytes is the least any path can reach.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time


def model_shape(gb: float) -> dict:
    """A DiffusionGemma-layout shape of about `gb` GB in bf16, mostly experts (like the 26B-A4B model)."""
    from hackable_diffusion.models import presets

    shape = presets.derived(
        vocab_size=32_768,
        embed_dim=1024,
        num_layers=6,
        num_heads=8,
        head_dim=128,
        num_kv_heads=4,
        ffw_hidden=2048,
        global_head_dim=256,
        global_num_kv_heads=2,
        self_conditioning=True,
        param_dtype="bfloat16",
        compute_dtype="bfloat16",
        moe=dict(num_experts=8, top_k=2, hidden_dim=1024),
    )
    per_expert_layer = 3 * 1024 * 1024 * 2  # gate, up, down in bf16
    experts = max(8, int(gb * 1e9 / (6 * per_expert_layer)) // 8 * 8)
    shape["moe"] = dict(shape["moe"], num_experts=experts)
    return shape


def write_checkpoint(directory: pathlib.Path, gb: float) -> int:
    import jax
    import numpy as np

    from hackable_diffusion.checkpoints import gemma as gemma_ckpt
    from hackable_diffusion.checkpoints import hf as hf_ckpt
    from hackable_diffusion.checkpoints import hf_files
    from hackable_diffusion.models.config import TransformerConfig

    cfg = TransformerConfig.from_dict(model_shape(gb))
    rng = np.random.default_rng(0)
    import ml_dtypes

    params = gemma_ckpt.unflatten_tree(
        {
            path: (rng.standard_normal(s.shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)
            for path, s in gemma_ckpt.toolbox_shapes(cfg).items()
        }
    )
    hf_ckpt.save_hf(directory, cfg, params, canvas_length=256, max_shard_bytes=10**9)
    del params, jax
    return hf_files.checkpoint_bytes(directory)


def _status(field: str) -> int:
    """A /proc/self/status memory field (VmRSS: resident now, VmHWM: the peak since the last reset), in bytes."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def measure(path: str, directory: str, devices: int) -> dict:
    """Runs in a fresh process: loads the checkpoint one way and reports memory and time."""
    import jax
    import numpy as np

    from hackable_diffusion.checkpoints import gemma as gemma_ckpt
    from hackable_diffusion.checkpoints import hf as hf_ckpt
    from hackable_diffusion.checkpoints import hf_files
    from hackable_diffusion.models import partitioning
    from hackable_diffusion.training import sharding

    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:devices]).reshape(1, devices, 1, 1), ("data", "fsdp", "expert", "tensor")
    )
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current resident size
    before = _status("VmRSS")
    start = time.perf_counter()
    if path == "naive":
        checkpoint = hf_ckpt.load_hf(directory)
        shardings = sharding.param_shardings(checkpoint.params, partitioning.logical_axes, mesh)
        params = jax.device_put(checkpoint.params, shardings)
    else:
        params = hf_ckpt.load_hf(directory, mesh=mesh).params
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start
    peak, after = _status("VmHWM"), _status("VmRSS")
    leaves = gemma_ckpt.flatten_tree(params)
    on_devices = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves.values())
    # what the devices hold: more than the parameters where a leaf is replicated (norms, or a dim no mesh axis divides)
    device_bytes = sum(shard.data.nbytes for x in leaves.values() for shard in x.addressable_shards)
    size = hf_files.checkpoint_bytes(directory)
    return {
        "benchmark": "bench_load",
        "path": path,
        "devices": devices,
        "checkpoint_bytes": size,
        "param_bytes": on_devices,
        "rss_before_bytes": before,
        "peak_rss_bytes": peak,
        "rss_after_over_checkpoint": round((after - before) / hf_files.checkpoint_bytes(directory), 3),
        "peak_rss_over_checkpoint": round((peak - before) / size, 3),
        "device_bytes": device_bytes,
        "peak_rss_over_device_bytes": round((peak - before) / device_bytes, 3),
        "seconds": round(seconds, 2),
        "gb_per_s": round(size / seconds / 1e9, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="approximate checkpoint size")
    parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices (even)")
    parser.add_argument("--dir", default="/tmp/hd_bench_ckpt", help="where the random checkpoint is written")
    parser.add_argument("--measure", default="", help=argparse.SUPPRESS)  # internal: run one path in this process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.dir, args.devices)))
        return
    directory = pathlib.Path(args.dir)
    from hackable_diffusion.checkpoints import hf_files

    if not hf_files.is_hf_directory(directory):
        write_checkpoint(directory, args.gb)
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices}", JAX_PLATFORMS="cpu")
    for path in ("naive", "sharded"):
        out = subprocess.run(
            [sys.executable, __file__, "--measure", path, "--dir", str(directory), "--devices", str(args.devices)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
