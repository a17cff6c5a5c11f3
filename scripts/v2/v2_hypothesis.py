"""Pytest plugin for the cgroup v2 guest (scripts/test-v2.sh): a Hypothesis profile
for a machine that is ~8x slower (no deadline, no too_slow/filter_too_much checks)."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "v2guest", deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large])
settings.load_profile("v2guest")
