"""LimitsConfig validation names the field; the defaults are the documented ones."""

from __future__ import annotations

import argparse

import pytest

from proxy.config import ConfigError
from proxy.limits import LimitsConfig, add_limit_arguments, limits_from_args


@pytest.mark.parametrize(("overrides", "field"), [
    ({"max_in_flight_per_model": 0}, "max_in_flight_per_model"),
    ({"max_queued_per_model": -1}, "max_queued_per_model"),
    ({"queue_timeout_s": 0}, "queue_timeout_s"),
    ({"rate_limit_rps": -2.0}, "rate_limit_rps"),
    ({"rate_limit_burst": 0}, "rate_limit_burst"),
    ({"shutdown_grace_s": -1}, "shutdown_grace_s"),
    ({"header_timeout_s": 0}, "header_timeout_s"),
    ({"body_timeout_s": -1.0}, "body_timeout_s"),
    ({"keepalive_timeout_s": 0}, "keepalive_timeout_s"),
    ({"max_connections_per_client": -1}, "max_connections_per_client"),
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


def test_slow_client_defaults_and_their_flags():
    lim = LimitsConfig()
    assert (lim.header_timeout_s, lim.body_timeout_s, lim.keepalive_timeout_s, lim.max_connections_per_client) == (
        10.0, 60.0, 75.0, 1024)
    parser = argparse.ArgumentParser()
    add_limit_arguments(parser)
    args = parser.parse_args(["--header-timeout-s", "2", "--body-timeout-s", "3", "--keepalive-timeout-s", "4",
                              "--max-connections-per-client", "0"])
    lim = limits_from_args(args)
    assert (lim.header_timeout_s, lim.body_timeout_s, lim.keepalive_timeout_s, lim.max_connections_per_client) == (
        2.0, 3.0, 4.0, 0)
