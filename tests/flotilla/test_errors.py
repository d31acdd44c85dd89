"""One ConfigError: every package's bad-setting error is it, or a subclass where the name means something."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fake_engines.core import ConfigError as CoreConfigError
from fake_engines.driver.faults import FaultConfigError
from fake_engines.llamacpp.config import ServerConfigError
from fake_engines.vllm.config import ServeConfigError
from flotilla.errors import ConfigError, FlagError
from flotilla.plan.fit import PlanError
from flotilla.testing import FleetSpecError
from policies.routing import ConfigError as RoutingConfigError
from policies.scaling.base import ConfigError as ScalingConfigError
from proxy.autoscale.signals import SignalError
from proxy.config import ConfigError as ProxyConfigError


def test_every_package_raises_the_one_config_error() -> None:
    assert CoreConfigError is RoutingConfigError is ScalingConfigError is ProxyConfigError is ConfigError
    for cls in (FaultConfigError, FlagError, PlanError, SignalError, ServeConfigError, ServerConfigError,
                FleetSpecError):
        assert issubclass(cls, ConfigError) and issubclass(cls, ValueError)


def test_the_message_names_source_field_value_and_reason() -> None:
    err = ConfigError("bound", "high", "expected float/NoneType")
    assert str(err) == "bound='high': expected float/NoneType"
    located = err.located("fleet.yaml")
    assert str(located) == "fleet.yaml: bound='high': expected float/NoneType"
    assert (located.field, located.value, located.reason, located.source) == ("bound", "high",
                                                                              "expected float/NoneType", "fleet.yaml")


def test_a_flag_error_is_its_one_line_message() -> None:
    with pytest.raises(ConfigError) as err:
        raise PlanError("--users must be >= 1, got 0")
    assert str(err.value) == "--users must be >= 1, got 0" and err.value.reason == str(err.value)


def test_the_error_module_imports_no_other_package_of_the_project() -> None:
    code = ("import sys, flotilla.errors; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('proxy', 'sim', 'policies', 'fake_engines', 'loadgen') or m.startswith('flotilla.') "
            "and m != 'flotilla.errors'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
