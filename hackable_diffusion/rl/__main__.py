"""`python -m hackable_diffusion.rl`: see `hackable_diffusion.rl.command`."""

from hackable_diffusion import cli
from hackable_diffusion.rl import command

if __name__ == "__main__":
    cli.run_command(command.define_flags, command.main, command.__doc__)
