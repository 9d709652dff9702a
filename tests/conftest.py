"""Hypothesis profiles of the test suite.

* Default (CI, ``make test``): hypothesis' own defaults and each test's explicit ``@settings``; the trained-side
  properties (tests/test_trained_properties.py) run a few examples each (``trained_settings`` in
  tests/trained_properties.py).
* ``thorough`` (``make test HYPOTHESIS_PROFILE=thorough``, which sets ``DICTCHECK_HYPOTHESIS_PROFILE``): more
  examples for every hypothesis test without an explicit count, and the thorough counts of the trained-side
  properties.

Both keep hypothesis' example database (its default ``.hypothesis/``, git-ignored): a failing example is shrunk
and stored, and the next run replays it first.
"""

from __future__ import annotations

import os

from hypothesis import settings

#: Environment variable naming the hypothesis profile (also read by tests/trained_properties.py).
PROFILE_ENV = "DICTCHECK_HYPOTHESIS_PROFILE"

settings.register_profile("thorough", max_examples=300, deadline=None)

if os.environ.get(PROFILE_ENV):
    settings.load_profile(os.environ[PROFILE_ENV])
