"""`python -m hackable_diffusion.serve`: see `hackable_diffusion.serve.command`."""

from hackable_diffusion import cli
from hackable_diffusion.serve import command

if __name__ == "__main__":
    cli.run_command(command.define_flags, command.main, command.__doc__)
