"""`experiments/tooling/import_walk.py`: the modules a command loads and the imports that climb back up the layers of
pyproject.toml's contract while it runs (function-level imports included)."""

import import_walk


def test_layers_come_from_the_contract_highest_first():
    stack = import_walk.layers()
    assert "train" in stack[0] and "models" in stack[-2] and "data" in stack[-1]
    assert import_walk.layer_of("hackable_diffusion.sampling.canvas", stack) > import_walk.layer_of(
        "hackable_diffusion.training.loop", stack
    )
    assert import_walk.layer_of("hackable_diffusion", stack) is None


def test_a_lower_layer_importing_a_higher_one_is_a_climb_back(tmp_path):
    files = {}
    for name in ("models/transformer.py", "tasks/text.py", "training/loop.py"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\ny = 2\n")
        files["hackable_diffusion." + name.removesuffix(".py").replace("/", ".")] = str(path)
    record = {
        "loaded": {**files, "hackable_diffusion": str(tmp_path / "__init__.py")},
        "edges": [
            ["hackable_diffusion.training.loop", "hackable_diffusion.models.transformer"],  # downward: fine
            ["hackable_diffusion.models.transformer", "hackable_diffusion.tasks.text"],  # upward: a climb-back
        ],
    }
    summary = import_walk.summarise(record, ["-m", "x"])
    assert summary["modules"] == 3 and summary["lines"] == 6
    assert summary["per_package"] == {"models": 1, "tasks": 1, "training": 1}
    assert summary["climb_backs"] == [
        {"importer": "hackable_diffusion.models.transformer", "imports": "hackable_diffusion.tasks.text"}
    ]


def test_a_command_walks_without_climbing_back():
    """The recorder end to end on a light command: what it loads is recorded, and no import climbs a layer."""
    summary = import_walk.summarise(
        import_walk.walk(["-m", "hackable_diffusion.evaluate", "--help"]), ["-m", "evaluate"]
    )
    assert summary["modules"] > 10 and "run_config" in summary["module_list"]
    assert summary["climb_backs"] == []
