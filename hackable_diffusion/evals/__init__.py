"""evals sub-package."""
