"""The commands' persistent compilation cache (`cli.use_compilation_cache`): where it lives, HD_COMPILATION_CACHE moving
it or (0) turning it off, and every command turning it on before its main runs."""

import os
import subprocess
import sys
import textwrap

import pytest

from hackable_diffusion import cli


def test_the_cache_directory_follows_hd_compilation_cache_then_jax_then_the_user_cache_home(tmp_path):
    home = {"HOME": "/home/someone"}
    assert cli.compilation_cache_dir(home) == "/home/someone/.cache/hackable_diffusion/jax"
    assert cli.compilation_cache_dir(home | {"XDG_CACHE_HOME": "/xdg"}) == "/xdg/hackable_diffusion/jax"
    assert cli.compilation_cache_dir(home | {"XDG_CACHE_HOME": ""}) == "/home/someone/.cache/hackable_diffusion/jax"
    jax_own = home | {"JAX_COMPILATION_CACHE_DIR": "/jax/cache"}
    assert cli.compilation_cache_dir(jax_own) == "/jax/cache"
    assert cli.compilation_cache_dir(jax_own | {"HD_COMPILATION_CACHE": str(tmp_path)}) == str(tmp_path)
    for off in ("0", "off", "false", " 0 "):
        assert cli.compilation_cache_dir(jax_own | {"HD_COMPILATION_CACHE": off}) is None


def test_an_unusable_hd_compilation_cache_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="HD_COMPILATION_CACHE=.*a_file.*give a writable directory, or 0"):
        cli.use_compilation_cache({"HD_COMPILATION_CACHE": str(blocker / "cache")})


# A fresh process (JAX reads the cache settings once, at its first compilation): turn the cache on as a command does,
# compile one small program, and say whether the cache is on and what the two candidate directories hold.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    import jax, jax.numpy as jnp
    from hackable_diffusion import cli
    chosen = cli.use_compilation_cache()
    jax.jit(lambda x: jnp.sin(x) * 3)(jnp.arange(5.0)).block_until_ready()
    files = {d: sorted(os.listdir(d)) if os.path.isdir(d) else [] for d in sys.argv[1:]}
    print(json.dumps({"chosen": chosen, "enabled": jax.config.jax_enable_compilation_cache, "files": files}))
    """
)


def probe(tmp_path, **env) -> dict:
    import json

    environ = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_PERSISTENT_CACHE", "HD_COMPILATION"))}
    environ.update(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_own"), **env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "jax_own"), str(tmp_path / "ours")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_hd_compilation_cache_moves_the_cache_and_caches_small_programs(tmp_path):
    seen = probe(tmp_path, HD_COMPILATION_CACHE=str(tmp_path / "ours"))
    assert seen["chosen"] == str(tmp_path / "ours") and seen["enabled"]
    # JAX's default thresholds (1 s of compile time) would keep this program out of the cache
    assert any(name.startswith("jit__lambda") for name in seen["files"][str(tmp_path / "ours")])
    assert seen["files"][str(tmp_path / "jax_own")] == []


@pytest.mark.slow
def test_hd_compilation_cache_0_turns_the_cache_off(tmp_path):
    seen = probe(tmp_path, HD_COMPILATION_CACHE="0")
    assert seen["chosen"] is None and not seen["enabled"]
    assert seen["files"] == {str(tmp_path / "jax_own"): [], str(tmp_path / "ours"): []}


def test_every_command_turns_the_cache_on_before_its_main(monkeypatch):
    """`cli.run_command` (train, sample, evaluate, sft, serve, rl, distill, convert, quantize) and the lm-eval harness
    call `use_compilation_cache` before the command runs."""
    from hackable_diffusion.evals import harness

    calls = []
    monkeypatch.setattr(cli, "use_compilation_cache", lambda: calls.append("cache"))
    monkeypatch.setattr(sys, "argv", ["command"])
    with pytest.raises(SystemExit) as exit_info:
        cli.run_command(lambda argv: argv, lambda argv: calls.append("main"), "A command.")
    assert exit_info.value.code in (0, None) and calls == ["cache", "main"]
    source = open(harness.__file__).read()
    assert source.index("cli.use_compilation_cache()") < source.index("parser.execute(namespace)")
