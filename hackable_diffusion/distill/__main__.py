"""`python -m hackable_diffusion.distill`: see `hackable_diffusion.distill.command`."""

from hackable_diffusion import cli
from hackable_diffusion.distill import command

if __name__ == "__main__":
    cli.run_command(command.define_flags, command.main, command.__doc__)
