"""LimitsConfig validation names the field; the defaults are the documented ones."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError
from proxy.limits import LimitsConfig


@pytest.mark.parametrize(("overrides", "field"), [
    ({"max_in_flight_per_model": 0}, "max_in_flight_per_model"),
    ({"max_queued_per_model": -1}, "max_queued_per_model"),
    ({"queue_timeout_s": 0}, "queue_timeout_s"),
    ({"rate_limit_rps": -2.0}, "rate_limit_rps"),
    ({"rate_limit_burst": 0}, "rate_limit_burst"),
    ({"shutdown_grace_s": -1}, "shutdown_grace_s"),
    ({"api_keys": ("ok", " ")}, "api_keys"),
    ({"backend_networks": ("10.0.0.0/33",)}, "backend_networks"),
])
def test_invalid_limits_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        LimitsConfig(**overrides)
    assert err.value.field == field


def test_defaults_allow_loopback_backends_only_and_no_keys_or_rate_limit():
    lim = LimitsConfig()
    assert [str(n) for n in lim.networks] == ["127.0.0.0/8", "::1/128"]
    assert lim.api_keys == () and lim.rate_limit_rps is None
    assert (lim.max_in_flight_per_model, lim.max_queued_per_model, lim.shutdown_grace_s) == (512, 1024, 30.0)
