"""Adaptation schedules (`diffusion.adaptation`): closed-form values at known steps (traced and eager), mask annealing
equal to the causal mask at 0 and to the diffusion mask at 1, the canvas curriculum equal to the plain objective at
each of its sizes (the target included), the AR-loss schedule equal to a fixed encoder AR weight, clear errors for bad
keys and values, and a tiny AR run adapted for 2 steps with every schedule on (metrics, resume)."""

import contextlib
import dataclasses
import io
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_configs import tiny_text_config

from hackable_diffusion import builders, recipes, run_config, train
from hackable_diffusion.diffusion import adaptation as A
from hackable_diffusion.diffusion import objectives as O
from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.training.train_state import TrainState, make_train_step

V = 32


def tiny_model():
    model = T.Transformer(TransformerConfig.from_dict(presets.tiny(vocab_size=V, moe=False)))
    return model, T.init_params(model, jax.random.key(0))


def masking():
    return MaskingProcess(vocab_size=V, schedule=LinearSchedule(), mask_id=3)


def batch(b=2, l=16):
    return {"tokens": jax.random.randint(jax.random.key(1), (b, l), 4, V)}


def traced(schedule, step):
    return float(jax.jit(lambda s: schedule(s))(jnp.asarray(step, jnp.int32)))


@pytest.mark.parametrize(
    "step,size", [(0, 4), (24, 4), (25, 16), (49, 16), (50, 256), (124, 256), (125, 64), (10_000, 64), (None, 64)]
)
def test_canvas_curriculum_is_piecewise_constant_over_its_boundaries(step, size):
    curriculum = A.CanvasCurriculum((4, 16, 256, 64), (25, 50, 125))
    assert int(curriculum(step)) == size
    if step is not None:
        assert traced(curriculum, step) == size
        assert curriculum.distinct_sizes[int(curriculum.branch(step))] == size


def test_a_curriculum_that_comes_back_to_a_size_reuses_its_branch():
    curriculum = A.CanvasCurriculum((8, 32, 8), (10, 20))
    assert curriculum.distinct_sizes == (8, 32)
    assert [int(curriculum.branch(s)) for s in (0, 10, 20)] == [0, 1, 0]


@pytest.mark.parametrize("step,fraction", [(0, 0.0), (10, 0.0), (20, 0.5), (25, 0.75), (30, 1.0), (99, 1.0)])
def test_mask_annealing_rises_linearly_from_begin_to_end(step, fraction):
    annealing = A.MaskAnnealing(10, 30)
    assert float(annealing(step)) == pytest.approx(fraction)
    assert traced(annealing, step) == pytest.approx(fraction)
    assert float(annealing(None)) == 1.0


@pytest.mark.parametrize("step,weight", [(0, 2.0), (10, 2.0), (60, 1.5), (110, 1.0), (500, 1.0)])
def test_ar_loss_decay_moves_linearly_from_start_to_end(step, weight):
    decay = A.ArLossDecay(2.0, 1.0, 10, 110)
    assert float(decay(step)) == pytest.approx(weight)
    assert traced(decay, step) == pytest.approx(weight)
    assert float(decay(None)) == 1.0


def test_a_ramp_of_no_length_is_a_step_function():
    assert [float(A.linear_ramp(s, 5, 5)) for s in (4, 5, 6)] == [0.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "section,message",
    [
        (dict(canvas_sizes=(4, 8)), "one boundary step between consecutive sizes"),
        (dict(canvas_sizes=(4, 8), canvas_boundaries=(5, 3)), "one boundary step"),
        (dict(canvas_sizes=(8, 4), canvas_boundaries=(-1,)), "increasing steps >= 0"),
        (dict(canvas_sizes=(0,)), "all >= 1"),
        (dict(canvas_boundaries=(3,)), "canvas_sizes is empty"),
        (dict(mask_anneal_steps=(10,)), "must be a pair"),
        (dict(mask_anneal_steps=(10, 5)), "0 <= begin <= end"),
        (dict(ar_loss_weights=(1.0, 0.0)), "set both or neither"),
        (dict(ar_loss_weights=(-1.0, 0.0), ar_loss_steps=(0, 5)), "weights must be >= 0"),
        (dict(mask_steps=(0, 5)), "unknown config.adaptation keys"),
    ],
)
def test_bad_sections_are_refused_with_the_reason(section, message):
    with pytest.raises(ValueError, match=message):
        A.from_section(section)


def test_mask_annealing_goes_from_the_causal_mask_to_the_diffusion_mask_exactly():
    token_mask = jnp.array([[True] * 6 + [False] * 2, [True] * 8])
    diffusion = T.bidirectional_mask(token_mask)
    key = jax.random.key(3)
    np.testing.assert_array_equal(A.MaskAnnealing.mask(diffusion, jnp.float32(0.0), key), T.causal_mask(token_mask))
    np.testing.assert_array_equal(A.MaskAnnealing.mask(diffusion, jnp.float32(1.0), key), diffusion)
    half = A.MaskAnnealing.mask(diffusion, jnp.float32(0.5), key)
    extra = int(jnp.sum(half & ~T.causal_mask(token_mask)))
    assert 0 < extra < int(jnp.sum(diffusion & ~T.causal_mask(token_mask)))
    assert not bool(jnp.any(half & ~diffusion))


def objective(**kwargs):
    model, params = tiny_model()
    return O.DiffusionPretrainObjective(model, masking(), canvas_len=kwargs.pop("canvas_len", 4), **kwargs), params


def loss_at(obj, params, step, rng=jax.random.key(5)):
    return jax.jit(lambda p, s: obj(p, batch(), rng, step=s))(params, jnp.asarray(step, jnp.int32))


def plain_loss(obj, params, rng=jax.random.key(5)):
    return jax.jit(lambda p: obj(p, batch(), rng))(params)


def test_the_canvas_curriculum_at_each_size_is_the_plain_objective_at_that_size():
    adapted, params = objective(adaptation=A.Adaptation(canvas=A.CanvasCurriculum((2, 8, 4), (10, 20))))
    for step, size in ((0, 2), (15, 8), (25, 4)):
        loss, metrics = loss_at(adapted, params, step)
        plain, plain_metrics = plain_loss(dataclasses.replace(adapted, canvas_len=size, adaptation=None), params)
        assert float(metrics["adapt_canvas_len"]) == size
        np.testing.assert_array_equal(loss, plain)  # the target (step 25) included: exactly the plain loss
        np.testing.assert_array_equal(metrics["elbo_bits_per_token"], plain_metrics["elbo_bits_per_token"])
    sizes = {float(plain_loss(dataclasses.replace(adapted, canvas_len=s, adaptation=None), params)[0]) for s in (2, 8)}
    assert len(sizes) == 2  # the sizes give different losses: the comparison above can fail


def test_mask_annealing_at_its_end_is_the_plain_objective_and_before_it_is_not():
    for canvas_len in (4, None):
        adapted, params = objective(canvas_len=canvas_len, adaptation=A.Adaptation(mask=A.MaskAnnealing(0, 10)))
        plain = plain_loss(dataclasses.replace(adapted, adaptation=None), params)[0]
        np.testing.assert_array_equal(loss_at(adapted, params, 10)[0], plain)
        start, metrics = loss_at(adapted, params, 0)
        assert float(metrics["adapt_mask_fraction"]) == 0.0 and float(start) != float(plain)


def test_mask_annealing_at_zero_makes_the_decoder_causal_within_each_canvas():
    """At fraction 0 the first position's logits cannot depend on the canvas's later tokens."""
    model, params = tiny_model()
    tokens = batch(1, 4)["tokens"]
    logits = lambda x, fraction: T.forward(  # noqa: E731
        model,
        params,
        x,
        causal=False,
        mask=A.MaskAnnealing.mask(T.bidirectional_mask(jnp.ones((1, 4), bool)), fraction, jax.random.key(0)),
    )[0]
    changed = tokens.at[0, 3].set((tokens[0, 3] + 1) % V)
    np.testing.assert_array_equal(logits(tokens, 0.0)[0, :3], logits(changed, 0.0)[0, :3])
    assert not np.array_equal(logits(tokens, 1.0)[0, 0], logits(changed, 1.0)[0, 0])


def test_the_ar_loss_schedule_is_a_fixed_encoder_ar_weight_at_each_step():
    adapted, params = objective(adaptation=A.Adaptation(ar_loss=A.ArLossDecay(1.0, 0.0, 0, 10)))
    zero = plain_loss(dataclasses.replace(adapted, adaptation=None), params)[0]
    one = plain_loss(dataclasses.replace(adapted, adaptation=None, encoder_ar_weight=1.0), params)[0]
    np.testing.assert_array_equal(loss_at(adapted, params, 10)[0], zero)  # weight 0: exactly the plain loss
    np.testing.assert_allclose(loss_at(adapted, params, 0)[0], one, rtol=1e-6)
    assert float(one) > float(zero)
    loss, metrics = loss_at(adapted, params, 5)
    assert float(metrics["adapt_ar_weight"]) == 0.5
    np.testing.assert_allclose(loss, zero + 0.5 * metrics["encoder_ar_loss"], rtol=1e-6)


def test_without_a_step_the_objective_is_its_target():
    schedules = A.Adaptation(
        canvas=A.CanvasCurriculum((2, 4), (10,)), mask=A.MaskAnnealing(0, 10), ar_loss=A.ArLossDecay(1.0, 0.0, 0, 10)
    )
    adapted, params = objective(adaptation=schedules)
    plain = plain_loss(dataclasses.replace(adapted, adaptation=None), params)[0]
    np.testing.assert_array_equal(plain_loss(adapted, params)[0], plain)
    elbo, scored = adapted.elbo_per_example(params, batch(), jax.random.key(5))
    plain_elbo, _ = dataclasses.replace(adapted, adaptation=None).elbo_per_example(params, batch(), jax.random.key(5))
    np.testing.assert_array_equal(elbo, plain_elbo)


def test_the_train_step_passes_the_step_to_a_loss_that_uses_it():
    import optax

    adapted, params = objective(adaptation=A.Adaptation(mask=A.MaskAnnealing(0, 4)))
    assert adapted.uses_step and not dataclasses.replace(adapted, adaptation=None).uses_step
    optimizer = optax.sgd(0.0)
    step = jax.jit(make_train_step(adapted, optimizer))
    state = TrainState.create(params, optimizer, jax.random.key(0))
    fractions = []
    for _ in range(3):
        state, metrics = step(state, batch())
        fractions.append(float(metrics["adapt_mask_fraction"]))
    assert fractions == [0.0, 0.25, 0.5]


def test_objective_errors_name_the_setting():
    model, _ = tiny_model()
    with pytest.raises(ValueError, match="last size is 8, diffusion.canvas_len is 4"):
        O.DiffusionPretrainObjective(
            model, masking(), canvas_len=4, adaptation=A.Adaptation(canvas=A.CanvasCurriculum((4, 8), (5,)))
        )
    with pytest.raises(ValueError, match="replaces diffusion.encoder_ar_weight=1.0"):
        O.DiffusionPretrainObjective(
            model, masking(), canvas_len=4, encoder_ar_weight=1.0,
            adaptation=A.Adaptation(ar_loss=A.ArLossDecay(1.0, 0.0, 0, 5)),
        )  # fmt: skip
    with pytest.raises(ValueError, match="need block diffusion"):
        O.DiffusionPretrainObjective(model, masking(), adaptation=A.Adaptation(ar_loss=A.ArLossDecay(1, 0, 0, 5)))


def test_builders_refuse_adaptation_where_it_does_not_apply():
    config = tiny_text_config("none", moe=False)
    config.adaptation = recipes.adaptation_section(mask_anneal_steps=(0, 4))
    with pytest.raises(ValueError, match="schedules a diffusion pretraining run"):
        builders.build_objective(config, tiny_model()[0], None)
    config = tiny_text_config("masking", moe=False)
    config.adaptation = recipes.adaptation_section(canvas_sizes=(5, 8), canvas_boundaries=(1,))
    with pytest.raises(ValueError, match=r"canvas_sizes \[5\] do not divide config.data.seq_len=32"):
        builders.build_adaptation(config)
    config.adaptation = recipes.adaptation_section()
    assert builders.build_adaptation(config) is None  # every schedule off: the plain objective


def test_an_adapted_run_is_evaluated_at_another_canvas_with_its_schedules_at_their_end(tmp_path):
    from hackable_diffusion import experiment as exp_lib

    config = tiny_text_config("masking", moe=False)
    config.adaptation = recipes.adaptation_section(canvas_sizes=(4, 8), canvas_boundaries=(1,))
    assert exp_lib.schedules_at_end(config) is config  # the curriculum already ends at the run's canvas
    config.diffusion.canvas_len = 4  # evaluating the network at a canvas of 4
    with pytest.raises(ValueError, match="curriculum must end at the target canvas: its last size is 8"):
        exp_lib.build(config, str(tmp_path))  # training keeps the check
    exp = exp_lib.build(config, str(tmp_path), inference=True)
    assert exp.objective.canvas_len == 4 and exp.objective.adaptation.canvas.target == 4
    assert tuple(exp.config.adaptation.canvas_sizes) == (4, 4) and tuple(config.adaptation.canvas_sizes) == (4, 8)


@pytest.mark.parametrize("name", ["shakespeare_masking_from_ar", "shakespeare_uniform_from_ar", "ptb_masking_from_ar"])
def test_the_adaptation_recipes_start_from_the_ar_run_for_a_quarter_of_its_flops(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, f"configs/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    corpus = name.split("_")[0]
    ar = recipes.text_experiment(corpus, "none", moe=False)
    assert (config.init.kind, config.init.checkpoint) == ("toolbox", f"runs/{corpus}_ar")
    passes = builders.objective_passes(config)  # 2 (block masking) or 3 (+ self-conditioning) per AR step's 1
    assert abs(config.train.num_steps * passes - ar.train.num_steps / 4) <= passes / 2
    adaptation = builders.build_adaptation(config)
    assert adaptation.canvas.target == config.diffusion.canvas_len
    assert adaptation.mask is not None and adaptation.ar_loss is not None
    builders.build_objective(config, builders.build_model(config, 64), builders.build_process(config, 64))


@pytest.mark.slow
def test_an_ar_run_adapted_with_every_schedule_logs_them_and_resumes(trained_text_runs, tmp_path):
    source = trained_text_runs["none"]
    config = tiny_text_config("masking", steps=2, moe=False)
    config.init.kind, config.init.checkpoint = "toolbox", str(source)
    config.train.log_every = config.train.checkpoint_every = 1
    config.train.eval_every = 0
    config.adaptation = recipes.adaptation_section(
        canvas_sizes=(4, 8), canvas_boundaries=(1,), mask_anneal_steps=(0, 2),
        ar_loss_weights=(1.0, 0.0), ar_loss_steps=(0, 2),
    )  # fmt: skip
    workdir = tmp_path / "adapted"

    def run(config):
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            train.run(config, str(workdir), sample_at_end=False)
        return output.getvalue()

    run(config)
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r for r in lines if "adapt_canvas_len" in r}
    assert logged[1]["adapt_canvas_len"] == 4 and logged[2]["adapt_canvas_len"] == 8
    assert logged[1]["adapt_mask_fraction"] == 0.0 and logged[2]["adapt_mask_fraction"] == 0.5
    assert logged[1]["adapt_ar_weight"] == 1.0 and logged[2]["adapt_ar_weight"] == 0.5
    saved = run_config.load_saved_config(str(workdir))
    assert builders.build_adaptation(saved) == builders.build_adaptation(config)

    config.train.num_steps = 3
    output = run(config)
    assert "Restored checkpoint at step 2" in output
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert any(r["step"] == 3 and r.get("adapt_mask_fraction") == 1.0 for r in lines)


@pytest.mark.slow
def test_a_saved_run_without_the_section_builds_as_before(trained_text_runs, tmp_path):
    workdir = tmp_path / "masking"
    shutil.copytree(trained_text_runs["masking"], workdir)
    config = run_config.load_saved_config(str(workdir))
    assert "adaptation" not in config and builders.build_adaptation(config) is None
    objective = builders.build_objective(config, builders.build_model(config, 68), builders.build_process(config, 68))
    assert objective.adaptation is None and not objective.uses_step
