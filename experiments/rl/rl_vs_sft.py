"""RL against continued SFT from the same weights, at equal training FLOPs or equal wall time, on held-out problems.

  python experiments/rl/rl_vs_sft.py --rl_config configs/rl_countdown.py:ar --start runs/countdown_ar \
      --objectives ar_grpo,wd1 --rl_steps 100 --match flops --held_out 1000 --held_out_seed 7 \
      --workdir runs/rl_vs_sft_ar --out results/rl/rl_vs_sft.jsonl

Arms, each in its own folder under --workdir: `start` (the starting weights, evaluated only), `rl_OBJ` for each RL
objective (`python -m hackable_diffusion.rl`'s run with `rl.objective=OBJ`, --rl_steps steps, or as many as fit in
--rl_wall_s seconds), and `sft_OBJ`: continued supervised training (`hackable_diffusion.train` from the same starting
weights, `init` of the RL config) on the SAME problems RL draws its prompts from (`Task.rl_prompts` is the training
problems of the config's `data` section; the SFT arm trains on those problems' solver-made answers, the rows of the
same `data` section), with the RL config's optimizer (constant learning rate after its warm-up, no EMA) and a batch of
prompts_per_rollout x group_size rows, for as many steps as match the RL arm's FLOPs (`--match flops`) or its wall
time (`--match wall`: in training calls that each resume the last, sized from the step times the run logged, so
the SFT arm's wall time lands within about one call's start-up of RL's). Neither arm evaluates while training; each
is evaluated once at its last step on the same held-out problems (`--held_out` generated with `--held_out_seed`,
minus any training problem, decoded with the RL config's sampler section for every arm: the task's evaluation, as
`python -m hackable_diffusion.evaluate --num_problems N --problem_seed S`).

FLOPs are counted from the passes each arm runs, with `param_count.training_flops_per_token` (6 N + attention per
token for a forward and backward, attention over the whole row; a forward is a third of it) over rows of
data.seq_len tokens: SFT = steps x batch rows x forward+backward; RL = per draw the sampler's forwards (in place:
sampler.num_steps passes over the whole row; AR with its KV cache: each row's tokens once), per rollout the scorer's
forwards for the old policy's log-probs (one per inner update, objectives that clip a ratio) and the reference's
(with a KL term), per step the scorer's forward+backward (the trajectory scorer: one per group of passes). Wall time
is the seconds of each arm's training calls (start-up and compilation included, as a user waits for them). Each SFT
line names the budget that binds: at FLOP-matched steps "wall" when SFT took longer than RL (a wall budget would
have stopped it first), else "flops"; at wall-matched steps "flops" when SFT spent more FLOPs than RL, else "wall".

Statistics: per arm the exact-answer rate on the n held-out problems with its binomial standard error sqrt(p (1 - p)
/ n); per comparison (rl_OBJ - sft_OBJ, and each trained arm - start) the difference of the rates on the SAME
problems with its paired standard error sqrt(mean((d - mean d)^2) / n), d_i = a_i - b_i in {-1, 0, 1}, which is
sqrt((b + c) / n^2 - (b - c)^2 / n^3) for b and c problems solved by one arm only (McNemar's discordant counts).

Output: one JSON line per arm and per comparison in --out (the lines of an earlier call with the same --workdir are
replaced), and a markdown table. Resumable: rerunning the command reuses each arm's folder; a finished arm is not
trained again (`arm.json`), an evaluated one not evaluated again (`held_out_SEED_N.json`), and an arm stopped part
way resumes from its last checkpoint (the wall time of a call that was killed is lost from its count). Countdown runs
only (the held-out evaluation is Countdown's); RL objectives diffu_grpo, wd1 and ar_grpo.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import pathlib
import sys
import time

import numpy as np
from jaxtyping import Bool

OBJECTIVES = ("diffu_grpo", "wd1", "ar_grpo")
MATCHES = ("flops", "wall")
MAX_WALL_CALLS = 6  # training calls an arm may take to reach a wall budget (each resumes the one before)


# -- statistics -------------------------------------------------------------------------------------------------


def binomial_se(correct: Bool[np.ndarray, " n"]) -> float:
    """sqrt(p (1 - p) / n) of the exact-answer rate p over n problems."""
    correct = np.asarray(correct, bool)
    if correct.ndim != 1 or len(correct) == 0:
        raise ValueError(f"correct must be a non-empty 1-D array of booleans, got shape {correct.shape}.")
    p = float(correct.mean())
    return math.sqrt(p * (1.0 - p) / len(correct))


def paired_difference(a: Bool[np.ndarray, " n"], b: Bool[np.ndarray, " n"]) -> dict[str, float]:
    """The rate of `a` minus the rate of `b` on the same n problems, its paired standard error sqrt(mean((d - mean
    d)^2) / n) (d_i = a_i - b_i) and their ratio (NaN when the standard error is 0: the arms agree everywhere)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"a and b must be 1-D boolean arrays over the same problems, got {a.shape} and {b.shape}.")
    d = a.astype(np.float64) - b.astype(np.float64)
    diff = float(d.mean())
    se = math.sqrt(float(np.mean((d - diff) ** 2)) / len(d))
    return {"difference": diff, "se_difference": se, "z": diff / se if se > 0 else float("nan")}


# -- FLOPs ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FlopCounts:
    """Per-token FLOPs of one forward and of one forward+backward over rows of `seq_len` tokens."""

    forward_per_token: float
    train_per_token: float
    seq_len: int


def flop_counts(model: dict, seq_len: int) -> FlopCounts:
    from hackable_diffusion.models.config import TransformerConfig
    from hackable_diffusion.models.param_count import training_flops_per_token

    train = training_flops_per_token(TransformerConfig.from_dict(dict(model)), int(seq_len))
    return FlopCounts(train / 3.0, train, int(seq_len))


def sft_flops_per_step(counts: FlopCounts, batch_rows: int) -> float:
    return float(batch_rows * counts.seq_len * counts.train_per_token)


def rl_flops(
    counts: FlopCounts,
    rl: dict,
    *,
    steps: int,
    draws: float,
    autoregressive: bool,
    sampler_passes: int,
) -> float:
    """The FLOPs of `steps` RL steps made of `draws` sampler draws of K x G rows (see the module docstring)."""
    rows = int(rl["prompts_per_rollout"]) * int(rl["group_size"])
    mu = int(rl["inner_updates"])
    row_forward = rows * counts.seq_len * counts.forward_per_token
    row_train = rows * counts.seq_len * counts.train_per_token
    scorer_forwards = 1
    if rl.get("scorer", "mean_field") == "trajectory":
        scorer_forwards = math.ceil(sampler_passes / int(rl.get("trajectory_passes_per_forward", 1)))
    sampling = draws * (1 if autoregressive else sampler_passes) * row_forward
    rollouts = math.ceil(steps / mu)
    scored = (int(rl["objective"] in ("diffu_grpo", "ar_grpo")) + int(float(rl.get("kl_beta", 0.0)) > 0)) * mu
    scoring = rollouts * scored * scorer_forwards * row_forward
    updates = steps * scorer_forwards * row_train
    return float(sampling + scoring + updates)


def rl_draws(workdir: pathlib.Path, steps: int, inner_updates: int) -> float:
    """Sampler draws an RL run made: one per rollout, or with dynamic sampling the `draws` its metrics logged (each
    logged row: the mean over its steps; a rollout's mu steps report the same draws)."""
    rollouts = math.ceil(steps / inner_updates)
    path = workdir / "metrics.jsonl"
    if not path.is_file():
        return float(rollouts)
    total, last = 0.0, 0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("split") != "train" or "draws" not in row or row["step"] <= last or row["step"] > steps:
            continue
        total += float(row["draws"]) * (row["step"] - last) / inner_updates
        last = row["step"]
    return total + (steps - last) / inner_updates if last else float(rollouts)


# -- arms -------------------------------------------------------------------------------------------------------


class ArmState:
    """An arm's bookkeeping in `WORKDIR/ARM/arm.json`: steps trained, seconds of its training calls, done."""

    def __init__(self, folder: pathlib.Path):
        self.path = folder / "arm.json"
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {"steps": 0, "wall_s": 0.0}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1))

    @property
    def done(self) -> bool:
        return bool(self.data.get("done"))

    def check_budget(self, budget: dict) -> None:
        """Records the arm's budget the first time; a later call with another one is refused (its steps would not
        be what the line says)."""
        before = self.data.setdefault("budget", budget)
        if before != budget:
            raise ValueError(
                f"{self.path.parent} was trained with {before}, this call asks for {budget}; use another --workdir "
                "(or the same budget flags to resume it)."
            )


def timed_call(state: ArmState, train_to, steps: int) -> float:
    """Trains the arm to `steps` steps, adds the call's seconds to its wall time; returns them."""
    start = time.perf_counter()
    train_to(int(steps))
    seconds = time.perf_counter() - start
    state.data["steps"] = int(steps)
    state.data["wall_s"] = float(state.data["wall_s"]) + seconds
    state.data["calls"] = int(state.data.get("calls", 0)) + 1
    state.save()
    return seconds


def steady_seconds_per_step(workdir: pathlib.Path, after_step: int) -> float | None:
    """Seconds per step of a run's steps after `after_step` (one training call), from the times its metrics.jsonl
    rows were written: start-up and compilation left out; None with fewer than two logged rows."""
    path = workdir / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    rows = [r for r in rows if r.get("split") == "train" and r["step"] > after_step and "wall_time" in r]
    if len(rows) < 2 or rows[-1]["step"] <= rows[0]["step"]:
        return None
    return (rows[-1]["wall_time"] - rows[0]["wall_time"]) / (rows[-1]["step"] - rows[0]["step"])


def train_for_wall(
    state: ArmState, train_to, wall_s: float, first_steps: int, multiple: int = 1, workdir: pathlib.Path | None = None
) -> None:
    """Calls `train_to` with growing step counts until the arm's wall time reaches `wall_s` (or MAX_WALL_CALLS
    calls): the first to `first_steps`, each later one sized by the last call's seconds per step (from `workdir`'s
    metrics when it logged them, less that call's start-up; else the mean over the arm's calls so far). With the
    start-up known, it stops short of `wall_s` when less than one start-up is missing (closer than another call)."""
    if int(state.data["steps"]) == 0:
        timed_call(state, train_to, max(multiple, first_steps))
        state.data["last_call"] = [0, float(state.data["wall_s"])]
        state.save()
    while float(state.data["wall_s"]) < wall_s and int(state.data.get("calls", 0)) < MAX_WALL_CALLS:
        steps, spent = int(state.data["steps"]), float(state.data["wall_s"])
        before, call_s = state.data.get("last_call", [0, spent])
        per_step = steady_seconds_per_step(workdir, int(before)) if workdir is not None else None
        start_up = 0.0
        if per_step is None or per_step <= 0:
            per_step = spent / steps
        else:
            start_up = max(0.0, float(call_s) - per_step * (steps - int(before)))
            if wall_s - spent < start_up:  # another call would overshoot by more than what is missing
                break
        more = max(1, int((wall_s - spent - start_up) / per_step))
        more = multiple * math.ceil(more / multiple)
        call_s = timed_call(state, train_to, steps + more)
        state.data["last_call"] = [steps, call_s]
        state.save()


def rl_config_for(base, objective: str, steps: int, checkpoint_every: int):
    c = base.copy_and_resolve_references()
    c.rl.objective = objective
    c.train.num_steps = int(steps)
    c.train.eval_every = 0
    c.train.checkpoint_every = int(checkpoint_every)
    return c


def sft_config_for(base, start_config, steps: int, checkpoint_every: int):
    """`hackable_diffusion.train`'s config of the SFT arm: the RL config's data, optimizer, seed and starting weights,
    the starting run's model and diffusion recipe, without the rl and lora sections, a batch of K x G rows."""
    import ml_collections

    c = base.copy_and_resolve_references()
    rows = int(c.rl.prompts_per_rollout) * int(c.rl.group_size)
    with c.unlocked():
        del c["rl"]
        if "lora" in c:
            del c["lora"]
        c.model = ml_collections.ConfigDict(start_config.model.to_dict())
        c.diffusion = ml_collections.ConfigDict(start_config.diffusion.to_dict())
    c.data.batch_size = rows
    c.train.num_steps = int(steps)
    c.train.eval_every = 0
    c.train.checkpoint_every = int(checkpoint_every)
    return c


# -- held-out evaluation ----------------------------------------------------------------------------------------


def held_out_file(folder: pathlib.Path, seed: int, n: int) -> pathlib.Path:
    return folder / f"held_out_{seed}_{n}.json"


def evaluate_arm(
    folder: pathlib.Path,
    run_dir: str,
    *,
    weights: str,
    step: int | None,
    sampler,
    n: int,
    seed: int,
    batch_size: int,
) -> dict:
    """Each held-out problem's exact answer (True/False) from the weights of `run_dir` decoded with `sampler` (one
    sampler section for every arm), cached in `folder`."""
    from hackable_diffusion import experiment
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.tasks.countdown import data as data_lib
    from hackable_diffusion.tasks.countdown import problems as problems_lib
    from hackable_diffusion.tasks.countdown import rewards
    from hackable_diffusion.tasks.countdown.inference import solve_problems

    cached = held_out_file(folder, seed, n)
    if cached.is_file():
        return json.loads(cached.read_text())
    exp = experiment.from_workdir(run_dir)
    params, at = toolbox.load_params(exp, run_dir, weights=weights, step=step)
    spec = dataclasses.asdict(data_lib.problem_spec(exp.config))
    generated = problems_lib.generate_problems(n, seed, **spec, cache_dir=exp.config.data.get("cache_dir") or "default")
    problems, dropped = data_lib.without_training_problems(generated, exp.data.train_problems)
    prompts = data_lib.prompt_rows(problems, int(exp.config.data.prompt_len))
    config = exp.config.copy_and_resolve_references()
    config.sampler = sampler
    completions = solve_problems(exp, params, prompts, seed=0, batch_size=batch_size, config=config)
    correct = rewards.row_rewards(prompts, completions) > 0
    keys = json.dumps(problems.problem_keys())
    out = {
        "step": int(at),
        "correct": correct.astype(int).tolist(),
        "labels": problems.labels.tolist(),
        "dropped_as_in_training": dropped,
        "problems_sha": hashlib.sha256(keys.encode()).hexdigest()[:16],
    }
    folder.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(out))
    return out


# -- the study --------------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rl_config", default="configs/rl_countdown.py:ar", help="RL config file[:ARG]")
    p.add_argument("--start", default="", help="the starting run (a toolbox workdir; default: the config's init)")
    p.add_argument("--objectives", default="ar_grpo,wd1", help=f"comma-separated, of {OBJECTIVES}")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--rl_steps", type=int, default=0, help="RL steps per objective (default: the config's)")
    budget.add_argument("--rl_wall_s", type=float, default=0.0, help="RL wall seconds per objective instead")
    p.add_argument("--match", default="flops", help=f"what the SFT arm matches of its RL arm: {MATCHES}")
    p.add_argument("--held_out", type=int, default=1000, help="held-out problems generated (minus training ones)")
    p.add_argument("--held_out_seed", type=int, default=7, help="their generator seed (not the training one)")
    p.add_argument("--eval_batch_size", type=int, default=256)
    p.add_argument("--checkpoint_every", type=int, default=50, help="steps between the arms' checkpoints")
    p.add_argument("--workdir", default="runs/rl_vs_sft", help="the arms' folders go here (rerunning resumes)")
    p.add_argument("--out", default="results/rl/rl_vs_sft.jsonl")
    args, overrides = p.parse_known_args(argv)
    return args, overrides


def check_args(args, config) -> list[str]:
    objectives = [o for o in args.objectives.split(",") if o]
    if not objectives or any(o not in OBJECTIVES for o in objectives):
        raise ValueError(f"--objectives={args.objectives!r} must be a comma-separated list of {OBJECTIVES}.")
    if args.match not in MATCHES:
        raise ValueError(f"--match={args.match!r} must be one of {MATCHES}.")
    if args.rl_steps < 0 or args.rl_wall_s < 0 or args.held_out < 1 or args.checkpoint_every < 1:
        raise ValueError("--rl_steps and --rl_wall_s must be >= 0, --held_out and --checkpoint_every >= 1.")
    if "rl" not in config or config.data.task != "countdown":
        raise ValueError(f"--rl_config={args.rl_config!r} must be a Countdown RL config (configs/rl_countdown.py).")
    if args.held_out_seed == int(config.data.generator_seed):
        raise ValueError(f"--held_out_seed={args.held_out_seed} is the training generator seed; pick another.")
    return objectives


def arm_line(name: str, objective: str, state: ArmState, flops: float, result: dict, **extra) -> dict:
    correct = np.asarray(result["correct"], bool)
    labels = np.asarray(result["labels"])
    by_label = {f"accuracy_{k.replace(' ', '_')}": float(correct[labels == k].mean()) for k in sorted(set(labels))}
    return {
        "kind": "arm",
        "arm": name,
        "objective": objective,
        "steps": int(state.data.get("steps", 0)),
        "wall_s": round(float(state.data.get("wall_s", 0.0)), 2),
        "flops": flops,
        "held_out": len(correct),
        "accuracy": float(correct.mean()),
        "se": binomial_se(correct),
        **by_label,
        **extra,
    }


def comparison_line(name_a: str, name_b: str, a: dict, b: dict) -> dict:
    if a["problems_sha"] != b["problems_sha"]:
        raise ValueError(f"{name_a} and {name_b} were evaluated on other problems; delete their held_out_*.json.")
    return {"kind": "comparison", "a": name_a, "b": name_b, **paired_difference(a["correct"], b["correct"])}


def markdown(lines: list[dict]) -> str:
    rows = ["| arm | objective | steps | wall s | FLOPs | accuracy | s.e. |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in (line for line in lines if line["kind"] == "arm"):
        rows.append(
            f"| {r['arm']} | {r['objective']} | {r['steps']} | {r['wall_s']:.1f} | {r['flops']:.3g} | "
            f"{100 * r['accuracy']:.1f}% | {100 * r['se']:.1f} |"
        )
    rows += ["", "| a - b | difference | s.e. | difference / s.e. |", "|---|---:|---:|---:|"]
    for r in (line for line in lines if line["kind"] == "comparison"):
        z = "–" if not math.isfinite(r["z"]) else f"{r['z']:.2f}"
        rows.append(f"| {r['a']} - {r['b']} | {100 * r['difference']:+.1f} | {100 * r['se_difference']:.1f} | {z} |")
    return "\n".join(rows)


def write_lines(out: pathlib.Path, study: str, lines: list[dict]) -> None:
    from hackable_diffusion import cli

    kept = []
    if out.is_file():
        kept = [line for line in out.read_text().splitlines() if line and json.loads(line).get("study") != study]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(f"{line}\n" for line in kept + [cli.json_line({"study": study, **r}) for r in lines]))


def say(message: str) -> None:
    print(f"[rl_vs_sft] {message}", flush=True)


def run(argv: list[str]) -> list[dict]:
    from hackable_diffusion import cli, run_config, train
    from hackable_diffusion.rl import command

    args, overrides = parse_args(argv)
    config = cli.load_config_file(args.rl_config)
    if overrides:
        config = cli.parse_config_overrides(config, overrides)
    objectives = check_args(args, config)
    if args.start:
        config.init.kind, config.init.checkpoint = "toolbox", args.start
    start = str(config.init.checkpoint)
    if config.init.kind != "toolbox" or not (pathlib.Path(start) / "config.json").is_file():
        raise ValueError(
            f"the starting run {start!r} is not a toolbox run directory; pass --start RUN (train one first, e.g. "
            "python -m hackable_diffusion.train --config configs/countdown_ar.py --workdir runs/countdown_ar)."
        )
    start_config = run_config.load_saved_config(start)
    autoregressive = start_config.diffusion.process == "none"
    if int(config.get("lora", {}).get("rank", 0)):
        raise ValueError(
            f"the RL config trains LoRA adapters (lora.rank={config.lora.rank}) and the SFT arm trains every weight; "
            "set --config.lora.rank=0 so that both arms train the same parameters."
        )
    for objective in objectives:  # an objective that does not fit the run stops the study before anything runs
        command.check_rl_config(rl_config_for(config, objective, 1, 1), autoregressive=autoregressive)
    rl_steps = int(args.rl_steps or (0 if args.rl_wall_s else config.train.num_steps))
    mu = int(config.rl.inner_updates)
    counts = flop_counts(start_config.model.to_dict(), int(config.data.seq_len))
    rows = int(config.rl.prompts_per_rollout) * int(config.rl.group_size)
    root = pathlib.Path(args.workdir)
    cli.quiet_library_logs()
    say(
        f"start {start}; objectives {objectives}; RL budget "
        + (f"{rl_steps} steps" if rl_steps else f"{args.rl_wall_s:.0f} s")
        + f"; SFT matched on {args.match}; held-out {args.held_out} problems of seed {args.held_out_seed}"
    )

    evaluate = dict(sampler=config.sampler, n=args.held_out, seed=args.held_out_seed, batch_size=args.eval_batch_size)
    init_step = int(config.init.get("step", 0)) or None
    say("evaluating the starting weights")
    first = evaluate_arm(root / "start", start, weights=str(config.init.weights), step=init_step, **evaluate)
    results = {"start": first}
    lines = [
        arm_line(
            "start", "-", ArmState(root / "start"), 0.0, first, run=start, start_step=first["step"],
            rl_config=args.rl_config, overrides=overrides, held_out_seed=args.held_out_seed,
            dropped_as_in_training=first["dropped_as_in_training"],
        )
    ]  # fmt: skip
    for i, objective in enumerate(objectives):
        rl_name, sft_name = f"rl_{objective}", f"sft_{objective}"
        rl_dir, sft_dir = root / rl_name, root / sft_name
        rl_state = ArmState(rl_dir)
        rl_state.check_budget({"rl_steps": rl_steps, "rl_wall_s": args.rl_wall_s, "overrides": overrides})
        if not rl_state.done:
            say(f"[{2 * i + 1}/{2 * len(objectives)}] {rl_name}: training from step {rl_state.data['steps']}")

            def rl_to(steps, objective=objective, rl_dir=rl_dir):
                command.run_rl(rl_config_for(config, objective, steps, args.checkpoint_every), str(rl_dir))

            if rl_steps:
                timed_call(rl_state, rl_to, rl_steps)
            else:
                first = mu * math.ceil(2 * max(1, int(config.train.log_every)) / mu)  # two logged rows: a rate
                train_for_wall(rl_state, rl_to, args.rl_wall_s, first_steps=first, multiple=mu, workdir=rl_dir)
            rl_state.data["done"] = True
            rl_state.save()
        steps = int(rl_state.data["steps"])
        draws = rl_draws(rl_dir, steps, mu)
        flops = rl_flops(
            counts,
            config.rl.to_dict(),
            steps=steps,
            draws=draws,
            autoregressive=autoregressive,
            sampler_passes=int(config.sampler.num_steps),
        )
        say(f"evaluating {rl_name}")
        results[rl_name] = evaluate_arm(rl_dir, str(rl_dir), weights="ema", step=None, **evaluate)
        lines.append(arm_line(rl_name, objective, rl_state, flops, results[rl_name], draws=draws))

        sft_state = ArmState(sft_dir)
        sft_state.check_budget({"match": args.match, "rl_steps": steps, "overrides": overrides})
        per_step = sft_flops_per_step(counts, rows)
        flops_steps = max(1, round(flops / per_step))
        if not sft_state.done:
            say(f"[{2 * i + 2}/{2 * len(objectives)}] {sft_name}: training from step {sft_state.data['steps']}")

            def sft_to(steps, sft_dir=sft_dir):
                train.run(sft_config_for(config, start_config, steps, args.checkpoint_every), str(sft_dir),
                          sample_at_end=False)  # fmt: skip

            if args.match == "flops":
                timed_call(sft_state, sft_to, flops_steps)
            else:
                target = float(rl_state.data["wall_s"])
                train_for_wall(sft_state, sft_to, target, first_steps=max(1, flops_steps // 2), workdir=sft_dir)
            sft_state.data["done"] = True
            sft_state.save()
        sft_flops = per_step * int(sft_state.data["steps"])
        if args.match == "flops":
            binding = "wall" if float(sft_state.data["wall_s"]) > float(rl_state.data["wall_s"]) else "flops"
        else:
            binding = "flops" if sft_flops > flops else "wall"
        say(f"evaluating {sft_name}")
        results[sft_name] = evaluate_arm(sft_dir, str(sft_dir), weights="ema", step=None, **evaluate)
        lines.append(
            arm_line(
                sft_name, "sft", sft_state, sft_flops, results[sft_name], matched=args.match, binding=binding,
                rl_flops=flops, rl_wall_s=round(float(rl_state.data["wall_s"]), 2), batch_rows=rows,
            )
        )  # fmt: skip
    for objective in objectives:
        lines.append(comparison_line(f"rl_{objective}", f"sft_{objective}", results[f"rl_{objective}"],
                                     results[f"sft_{objective}"]))  # fmt: skip
    for name in results:
        if name != "start":
            lines.append(comparison_line(name, "start", results[name], results["start"]))
    write_lines(pathlib.Path(args.out), str(root), lines)
    print(markdown(lines), flush=True)
    say(f"{len(lines)} lines written to {args.out}")
    return lines


def main(argv: list[str] | None = None) -> None:
    from hackable_diffusion import cli

    try:
        run(sys.argv[1:] if argv is None else argv)
    except (ValueError, FileNotFoundError) as error:
        cli.fail(str(error))


if __name__ == "__main__":
    main()
