"""Shared pytest setup: 8 simulated CPU devices for mesh tests, deterministic seeds."""

import os

# Must be set before jax initialises its backend: lets sharding tests build an 8-device mesh on a CPU.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
