"""Hypothesis settings for the property-based fuzz tests of tests/fuzz.

`make test` runs the "ci" profile: a fixed number of examples, derandomized (the same inputs
every run, so a failure reproduces and the suite stays within its time budget). `make fuzz`
sets CELLAR_FUZZ=1: the "fuzz" profile draws CELLAR_FUZZ_EXAMPLES (default 5000) fresh random
examples per property.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile("ci", max_examples=60, derandomize=True, deadline=None,
                          suppress_health_check=_SLOW_OK, database=None)
settings.register_profile("fuzz", max_examples=int(os.environ.get("CELLAR_FUZZ_EXAMPLES", "5000")),
                          deadline=None, suppress_health_check=_SLOW_OK)
settings.load_profile("fuzz" if os.environ.get("CELLAR_FUZZ") else "ci")
