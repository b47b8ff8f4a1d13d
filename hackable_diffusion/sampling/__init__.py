"""sampling sub-package."""
