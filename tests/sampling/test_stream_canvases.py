"""`generate.stream_canvases` (the host loop as an iterator, used by the server): it yields what `generate` returns,
the per-step host callback sees every step's canvas in order without changing a value, rows stopped before a canvas
stay stopped, and a shorter first canvas covers the answer with the right canvas lengths."""

import jax
import numpy as np
from _tiny_sampling import CANVAS, PROMPTS, STEPS, masking_sampler

from hackable_diffusion.data.tokenizers import MASK_ID, PAD_ID
from hackable_diffusion.sampling import selection as S
from hackable_diffusion.sampling.generate import canvas_spans, generate, stream_canvases

SAMPLER = masking_sampler(S.TopK())


class Recorder:
    """A hashable step callback (a static jit argument) that keeps what it is given."""

    def __init__(self):
        self.calls = []

    def __call__(self, step, canvas, running):
        self.calls.append((int(step), np.asarray(canvas).copy(), np.asarray(running).copy()))


def test_stream_equals_generate_and_the_step_callback_sees_every_step(model_and_params):
    model, params = model_and_params
    want = generate(model, params, PROMPTS, sampler=SAMPLER, key=3, max_new_tokens=3 * CANVAS, return_trajectory=True)
    recorder = Recorder()
    updates = list(
        stream_canvases(model, params, PROMPTS, sampler=SAMPLER, key=3, max_new_tokens=3 * CANVAS, on_step=recorder)
    )
    got = np.concatenate([u.tokens for u in updates], axis=1)
    np.testing.assert_array_equal(got, want.tokens[:, : got.shape[1]])
    assert [u.start for u in updates] == [CANVAS * i for i in range(len(updates))]
    assert updates[-1].forward_passes == want.forward_passes
    # the callback's canvases are the trajectory's, step by step, canvas after canvas
    steps_per_canvas = [int(max(u.steps)) for u in updates]
    assert len(recorder.calls) == sum(steps_per_canvas) and sum(steps_per_canvas) <= 3 * STEPS
    k = 0
    for u, trajectory in zip(updates, want.trajectories):
        for s in range(int(max(u.steps))):
            step, canvas, running = recorder.calls[k]
            assert step == s + 1
            np.testing.assert_array_equal(canvas[running], trajectory[s][running])
            k += 1
    # a masking canvas starts fully masked and the first step decides at least one position per running row
    first = recorder.calls[0][1]
    assert (first != MASK_ID).any(axis=1).all() and (first == MASK_ID).any()


def test_rows_stopped_before_a_canvas_produce_pad_and_release_the_loop(model_and_params):
    model, params = model_and_params
    seen = []

    def before(index):
        seen.append(index)
        return np.array([index >= 1, False])  # row 0 leaves after its first canvas

    updates = list(
        stream_canvases(
            model,
            params,
            PROMPTS,
            sampler=SAMPLER,
            key=1,
            max_new_tokens=3 * CANVAS,
            stop_tokens=(),
            before_canvas=before,
        )
    )
    assert seen == [0, 1, 2] and len(updates) == 3
    assert (updates[1].tokens[0] == PAD_ID).all() and (updates[2].tokens[0] == PAD_ID).all()
    assert updates[1].steps[0] == 0 and updates[1].finished[0]
    row_key = jax.random.fold_in(jax.random.key(1), 1)[None]  # row 1's key in the batch
    alone = list(
        stream_canvases(
            model, params, [PROMPTS[1]], sampler=SAMPLER, key=row_key, max_new_tokens=3 * CANVAS, stop_tokens=()
        )
    )
    np.testing.assert_array_equal(  # the other row is unaffected by its neighbour leaving
        np.concatenate([u.tokens[1] for u in updates]), np.concatenate([u.tokens[0] for u in alone])
    )


def test_a_short_first_canvas(model_and_params):
    model, params = model_and_params
    assert canvas_spans(10, 4) == [4, 4, 4]
    assert canvas_spans(10, 4, first_canvas_length=2) == [2, 4, 4, 2]  # the region of 3 whole canvases
    assert canvas_spans(2, 4, first_canvas_length=2) == [2]
    assert canvas_spans(9, 4, first_canvas_length=4) == [4, 4, 4]
    assert canvas_spans(9, 4, first_canvas_length=1) == [1, 4, 4, 3]
    updates = list(
        stream_canvases(
            model, params, PROMPTS, sampler=SAMPLER, key=0, max_new_tokens=9, first_canvas_length=1, stop_tokens=()
        )
    )
    assert [u.tokens.shape[1] for u in updates] == [1, 4, 4, 3] and [u.start for u in updates] == [0, 1, 5, 9]
    assert updates[0].steps.max() <= 2  # ceil(6 steps x 1 / 4): as many tokens per step as a full canvas decides
    two = next(
        stream_canvases(
            model,
            params,
            PROMPTS,
            sampler=SAMPLER,
            key=0,
            max_new_tokens=9,
            first_canvas_length=2,
            first_canvas_steps=2,
            stop_tokens=(),
            return_trajectory=True,
        )
    )
    assert two.trajectory.shape == (2, 2, 2) and (two.trajectory[0] == MASK_ID).any()
    result = generate(
        model, params, PROMPTS, sampler=SAMPLER, key=0, max_new_tokens=9, first_canvas_length=1, stop_tokens=()
    )
    np.testing.assert_array_equal(result.tokens, np.concatenate([u.tokens for u in updates], axis=1)[:, :9])
    assert (result.tokens != MASK_ID).all() and (result.tokens != PAD_ID).all()
