"""The one fine-tuning runner: full and LoRA trainables, the workdir's lock and undo, and every command on it."""

import ast
import pathlib

import jax
import ml_collections
import numpy as np
import pytest

from hackable_diffusion import finetune
from hackable_diffusion.checkpoints import gemma as gc
from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import presets
from hackable_diffusion.models.config import TransformerConfig

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hackable_diffusion"


@pytest.fixture(scope="module")
def base_params():
    cfg = TransformerConfig.from_dict({**presets.tiny(moe=True), "num_layers": 2})
    rng = np.random.default_rng(0)
    flat = {p: (0.2 * rng.standard_normal(s.shape)).astype(np.float32) for p, s in gc.toolbox_shapes(cfg).items()}
    return gc.unflatten_tree(flat)


def _config(rank: int, freeze_router: bool = False) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {"lora": {"rank": rank, "alpha": 4.0, "targets": ["attn/q_einsum"], "include_experts": False,
                  "freeze_router": freeze_router}}  # fmt: skip
    )


def _equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_full_fine_tuning_starts_from_the_base_and_keeps_it_as_the_reference(base_params):
    trainable = finetune.Trainable.from_config(_config(0), base_params)
    assert trainable.adapter is None and trainable.trainable_mask is None
    params = trainable.init_fn(jax.random.key(0))
    assert _equal(params, base_params)
    moved = jax.tree.map(lambda x: x + 1.0, params)
    assert _equal(trainable.weights(moved), moved)  # the model computes with the state's parameters
    assert _equal(trainable.reference(moved), base_params)  # the KL's reference stays where the run started
    assert trainable.adapters(moved) is None and trainable.describe() == "full"
    frozen = finetune.Trainable.from_config(_config(0, freeze_router=True), base_params)
    assert frozen.trainable_mask is lora_lib.router_frozen_mask and "router frozen" in frozen.describe()


def test_lora_trains_adapters_over_a_frozen_base(base_params):
    trainable = finetune.Trainable.from_config(_config(2), base_params)
    assert trainable.adapter.rank == 2 and trainable.trainable_mask is lora_lib.trainable_mask
    assert trainable.logical_axes is lora_lib.logical_axes
    params = trainable.init_fn(jax.random.key(0))
    assert set(params) == {lora_lib.BASE_KEY, lora_lib.LORA_KEY}
    assert _equal(trainable.weights(params), base_params)  # B = 0 at the start: the merged weights are the base
    assert _equal(trainable.reference(params), params[lora_lib.BASE_KEY])
    grown = {**params, lora_lib.LORA_KEY: jax.tree.map(lambda x: x + 0.5, params[lora_lib.LORA_KEY])}
    merged = trainable.weights(grown)
    assert not _equal(merged, base_params)  # the adapters reach the weights the model computes with
    seen = []
    loss = trainable.loss_fn(lambda weights, batch, key: (seen.append(weights) or 0.0, {}))
    loss(grown, {}, None)
    assert _equal(seen[0], merged)  # the objective sees the merged weights
    assert "LoRA rank 2, alpha 4.0" in trainable.describe()


def test_a_start_that_fails_before_training_leaves_nothing_and_a_started_run_keeps_its_files(tmp_path):
    work = tmp_path / "run"

    def fails_early(started):
        work.mkdir(exist_ok=True)
        (work / "config.json").write_text("{}")
        raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        finetune.locked_start(str(work), fails_early)
    assert not (work / "config.json").exists()

    def fails_late(started):
        (work / "config.json").write_text("{}")
        started()
        raise RuntimeError("a step failed")

    with pytest.raises(RuntimeError):
        finetune.locked_start(str(work), fails_late)
    assert (work / "config.json").exists()


def _calls(module: pathlib.Path) -> set[str]:
    """Dotted names of the functions a module calls (`a.b(...)` -> "a.b")."""
    names = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Call):
            names.add(ast.unparse(node.func))
    return names


@pytest.mark.parametrize("command", ["train.py", "sft.py", "rl/command.py", "distill/command.py"])
def test_every_training_command_runs_the_one_loop_entry(command):
    calls = _calls(PACKAGE / command)
    assert "finetune.locked_start" in calls
    assert calls & {"finetune.finetune", "finetune.train_loop"}
    assert "loop.train" not in calls and "WorkdirLock" not in calls
    assert "lora_lib.init_state" not in calls and "builders.build_adapter" not in calls  # the runner's Trainable
