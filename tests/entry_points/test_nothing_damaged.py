"""Bad input to a command never damages what the user has: each refusal is one `error:` line (an exception of
`cli.USER_ERRORS` with a one-line message, which `cli.run_command` prints as one line with exit status 2; or a 400
from the server), and the run directory involved holds the same bytes before and after (sha256 of every file).

Covered: train with a config of another task or model shape on an existing run, a negative learning rate, a workdir
that cannot be written (read-only, a file), serve on a taken port or a port outside 0-65535, text outside the
tokenizer's vocabulary sent to the server, sample asked for more tokens than the context, quantize writing inside the
source run, and failed starts of rl / sft / distill, which leave nothing behind. A tiny Sudoku run is trained once for
the module; the text runs are the shared tiny ones (`conftest.trained_text_runs`), copied before use.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
import shutil
import socket

import pytest
from _commands import one_error_line, run_module
from _tiny_configs import tiny_text_config
from _tiny_sudoku import train_tiny_sudoku_run

from hackable_diffusion import cli, run_config, train
from hackable_diffusion.rl import settings as rl_settings
from hackable_diffusion.training import workdir_lock

REPO = pathlib.Path(__file__).resolve().parents[2]


def digest(directory: pathlib.Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `directory` (the directory itself if it is a file)."""
    directory = pathlib.Path(directory)
    if directory.is_file():
        return {".": hashlib.sha256(directory.read_bytes()).hexdigest()}
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def refused(call, match: str) -> str:
    """The message of the user error `call()` raises: one of the commands' one-line errors, matching `match`."""
    with pytest.raises(cli.USER_ERRORS) as failure:
        call()
    message = str(failure.value)
    assert "\n" not in message, message
    assert match in message, message
    return message


@pytest.fixture(scope="module")
def sudoku_run(tmp_path_factory):
    """(config, run directory) of a tiny Sudoku run trained for 4 steps, one checkpoint."""
    return train_tiny_sudoku_run(tmp_path_factory.mktemp("sudoku_run"))


@pytest.fixture(scope="module")
def text_run(trained_text_runs, tmp_path_factory):
    """A copy of the shared tiny masking text run (the tests must not write into the shared one)."""
    return pathlib.Path(shutil.copytree(trained_text_runs["masking"], tmp_path_factory.mktemp("text") / "run"))


# ------------------------------------------------------------------------------------------------------------------
# train: another run's workdir, a negative learning rate, a workdir that cannot be written
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_train_refuses_a_run_of_another_task_before_writing(sudoku_run):
    _, workdir = sudoku_run
    before = digest(workdir)
    text_config = cli.load_config_file(str(REPO / "configs/quickstart.py"))
    refused(lambda: train.run(text_config, str(workdir)), f"{workdir} holds a sudoku run; this config trains text")
    assert digest(workdir) == before


@pytest.mark.slow
def test_train_refuses_a_run_of_another_model_shape_before_writing(sudoku_run):
    config, workdir = sudoku_run
    before = digest(workdir)
    bigger = config.copy_and_resolve_references()
    bigger.model.ffw_hidden = int(config.model.ffw_hidden) * 2
    refused(lambda: train.run(bigger, str(workdir)), "another model shape (model.ffw_hidden:")
    longer = config.copy_and_resolve_references()
    longer.train.num_steps = 8  # continuing the run for longer is the same run
    run_config.check_same_run(longer, workdir)
    assert digest(workdir) == before


@pytest.mark.slow
def test_train_command_on_another_runs_workdir_is_one_error_line(sudoku_run):
    _, workdir = sudoku_run
    before = digest(workdir)
    out = run_module("hackable_diffusion.train", "--config=configs/quickstart.py", f"--workdir={workdir}")
    assert "holds a sudoku run; this config trains text: use another --workdir" in one_error_line(out)
    assert digest(workdir) == before


def test_a_negative_learning_rate_is_refused_before_anything_is_written(tmp_path):
    config = tiny_text_config()
    config.optimizer.peak_lr = -1.0
    refused(lambda: train.run(config, str(tmp_path / "run")), "optimizer.peak_lr=-1.0 must be a finite number >= 0")
    config.optimizer.peak_lr, config.optimizer.end_lr = 1e-3, -1e-5
    refused(lambda: train.run(config, str(tmp_path / "run")), "optimizer.end_lr=-1e-05")
    assert not (tmp_path / "run").exists()


def test_a_workdir_that_is_a_file_is_one_error_line(tmp_path):
    config = tiny_text_config()
    workdir = tmp_path / "run"
    workdir.write_text("my notes\n")
    refused(lambda: train.run(config, str(workdir)), f"--workdir {workdir} is a file")
    refused(lambda: train.run(config, str(workdir / "inner")), f"lies under {workdir}, which is a file")
    assert workdir.read_text() == "my notes\n"


def test_a_read_only_workdir_is_one_error_line(tmp_path, monkeypatch):
    config = tiny_text_config()
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("kept\n")
    before = digest(workdir)
    if os.geteuid() != 0:  # root writes anyway: the permission check is then shown with os.access answering no
        workdir.chmod(0o555)
    else:
        real_access = os.access

        def access(path, mode):
            return False if pathlib.Path(path) == workdir else real_access(path, mode)

        monkeypatch.setattr(workdir_lock.os, "access", access)
    try:
        refused(lambda: train.run(config, str(workdir)), f"--workdir {workdir} is not writable by this user")
    finally:
        workdir.chmod(0o755)
        monkeypatch.undo()
    assert digest(workdir) == before


def test_a_workdir_on_a_read_only_file_system_is_one_error_line(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(workdir_lock, "open", read_only, raising=False)  # the lock file is the first write
    workdir = tmp_path / "run"
    workdir.mkdir()
    refused(lambda: train.run(tiny_text_config(), str(workdir)), "Read-only file system")
    assert os.listdir(workdir) == []


# ------------------------------------------------------------------------------------------------------------------
# serve, sample, quantize
# ------------------------------------------------------------------------------------------------------------------


def test_serve_binds_before_announcing_and_refuses_a_taken_port_or_a_bad_one():
    from hackable_diffusion.serve import command

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused(lambda: command.bind_socket("127.0.0.1", port), f"cannot listen on 127.0.0.1:{port}")
    for bad in (70000, -1):
        refused(lambda: command.bind_socket("127.0.0.1", bad), f"--port={bad} is not a port")
    free = command.bind_socket("127.0.0.1", 0)  # 0: any free port
    try:
        assert free.getsockname()[1] > 0
    finally:
        free.close()


@pytest.mark.slow
def test_serve_command_on_a_taken_port_fails_before_announcing(text_run):
    pytest.importorskip("uvicorn")
    before = digest(text_run)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_module("hackable_diffusion.serve", f"--workdir={text_run}", f"--port={port}", timeout=120)
    assert f"cannot listen on 127.0.0.1:{port}" in one_error_line(out, alone=False)
    assert "serving on" not in out.stdout
    out = run_module("hackable_diffusion.serve", f"--workdir={text_run}", "--port=70000", timeout=120)
    assert "--port" in one_error_line(out) and "65535" in out.stderr
    assert digest(text_run) == before


@pytest.mark.slow
def test_serve_answers_text_outside_the_vocabulary_with_a_400(text_run):
    pytest.importorskip("uvicorn")
    from starlette.testclient import TestClient

    from hackable_diffusion import experiment
    from hackable_diffusion.serve.app import build_app
    from hackable_diffusion.serve.engine import Engine

    engine = Engine(experiment.from_workdir(str(text_run)), {}, start=False, model_name="tiny")
    with TestClient(build_app(engine)) as client:
        for route, body in (
            ("/v1/completions", {"prompt": "ROMEO: \u2603", "max_tokens": 4}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\u2603"}], "max_tokens": 4}),
        ):
            response = client.post(route, json=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert "not in the CharTokenizer vocabulary" in error["message"]
            assert error["type"] == "invalid_request_error"
    assert engine.queue_depth() == 0


@pytest.mark.slow
def test_sample_bounds_the_new_tokens_by_the_context(text_run):
    from hackable_diffusion import experiment, sample

    exp = experiment.from_workdir(str(text_run))
    trained = int(exp.config.data.seq_len)
    refused(lambda: sample.check_context(exp, ["ROMEO:"], 100_000_000), f"over the context of {2 * trained}")
    refused(lambda: sample.check_context(exp, ["ROMEO:"], 100, max_context=50), "context of 50 (--max_context)")
    sample.check_context(exp, ["ROMEO:"], 16)  # the run's own length passes
    before = digest(text_run)
    out = run_module("hackable_diffusion.sample", f"--workdir={text_run}", "--max_new_tokens=100000000", timeout=120)
    assert "over the context of" in one_error_line(out, alone=False)
    assert digest(text_run) == before


@pytest.mark.slow
def test_quantize_refuses_an_output_inside_or_around_the_source_run(text_run, tmp_path):
    from hackable_diffusion.quantize import quantize_run

    before = digest(text_run)
    refused(lambda: quantize_run(str(text_run), str(text_run / "fp8")), "overlaps --workdir")
    refused(lambda: quantize_run(str(text_run), str(text_run.parent)), "overlaps --workdir")
    assert digest(text_run) == before and not (text_run / "fp8").exists()


# ------------------------------------------------------------------------------------------------------------------
# failed starts of the fine-tuning commands leave nothing behind
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_rl_checks_the_objective_against_the_run_before_loading_and_leaves_nothing(sudoku_run, tmp_path, monkeypatch):
    from hackable_diffusion.checkpoints import base_weights
    from hackable_diffusion.rl import command

    config, source = sudoku_run

    def not_read(config):
        raise AssertionError("the starting weights were read before the objective was checked")

    monkeypatch.setattr(base_weights, "load_base", not_read)
    rl = rl_settings.rl_sections(config, checkpoint=str(source), objective="ar_grpo", steps=1)
    refused(lambda: command.run_rl(rl, str(tmp_path / "new")), "needs an autoregressive run")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine\n")
    refused(lambda: command.run_rl(rl, str(kept)), "needs an autoregressive run")
    assert os.listdir(kept) == ["notes.txt"]


def test_a_failed_sft_start_leaves_nothing(tmp_path):
    from hackable_diffusion import sft

    config = sft.sft_config()
    config.init.kind, config.init.checkpoint = "toolbox", str(tmp_path / "no_such_run")
    refused(lambda: sft.run_sft(config, str(tmp_path / "new")), "no_such_run")
    assert not (tmp_path / "new").exists()


def test_a_failed_distill_start_leaves_nothing(tmp_path):
    from hackable_diffusion.distill import command

    config = cli.load_config_file(str(REPO / "configs/distill_shakespeare_masking.py"))
    config.init.kind = "scratch"
    refused(lambda: command.run_distill(config, str(tmp_path / "new")), "distillation needs a teacher")
    assert not (tmp_path / "new").exists()


def test_a_failed_start_restores_what_it_rewrote_and_removes_only_what_it_added(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text('{"saved": true}\n')
    (workdir / "metrics.jsonl").write_text("{}\n")
    before = digest(workdir)
    with pytest.raises(RuntimeError, match="start failed"):
        with workdir_lock.WorkdirLock(workdir, undo_failed_start=True):
            (workdir / "config.json").write_text('{"saved": false}\n')
            (workdir / "tokenizer").mkdir()
            (workdir / "tokenizer" / "vocab.json").write_text("{}")
            raise RuntimeError("start failed")
    assert digest(workdir) == before and sorted(os.listdir(workdir)) == ["config.json", "metrics.jsonl"]
    with pytest.raises(RuntimeError, match="training failed"):
        with workdir_lock.WorkdirLock(workdir, undo_failed_start=True) as lock:
            lock.started()
            (workdir / "checkpoints").mkdir()
            raise RuntimeError("training failed")
    assert (workdir / "checkpoints").is_dir()  # what a started run wrote is kept
