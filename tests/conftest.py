"""Test-wide settings."""

import os

from hypothesis import settings

# CI explores a fixed set of examples (no flaky red from a new random draw); local runs keep
# exploring new ones. scripts/run-tests.sh selects the "ci" profile.
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
