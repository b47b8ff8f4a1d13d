"""diffusion sub-package."""
