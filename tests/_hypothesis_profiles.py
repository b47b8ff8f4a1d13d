"""Hypothesis profiles of the property tests: `ci` (the default: a bounded number of examples per property, every run
of the suite) and `thorough` (`HD_HYPOTHESIS_PROFILE=thorough`: thousands of examples)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HD_HYPOTHESIS_PROFILE", "ci"))
THOROUGH = os.environ.get("HD_HYPOTHESIS_PROFILE") == "thorough"
