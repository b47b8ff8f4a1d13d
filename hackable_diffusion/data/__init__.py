"""data sub-package."""
