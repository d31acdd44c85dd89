"""The autoscaler that runs inside the proxy: signals, the decision loop, actuators, holding
requests while the fleet scales from zero, and its metrics.

The proxy calls three things::

    from proxy.autoscale import add_arguments, attach, config_from_args
    add_arguments(parser)                      # --autoscale SPEC, --actuator, --engine-cmd, ...
    config = config_from_args(args)            # None when no autoscaler is asked for
    if config is not None:
        attach(app, config)                    # after build_app(), before the app starts

Importing this package stays light (no aiohttp) so command-line parsing stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.autoscale.config import (
    AutoscaleConfig,
    HoldSettings,
    add_arguments,
    config_from_args,
    config_from_mapping,
)

if TYPE_CHECKING:
    from aiohttp import web

    from proxy.autoscale.setup import AutoscaleRuntime
    from proxy.pool import BackendPool


def attach(app: web.Application, config: AutoscaleConfig, pool: BackendPool | None = None) -> AutoscaleRuntime:
    """Run the autoscaler inside the proxy `app`: see proxy.autoscale.setup.attach."""
    from proxy.autoscale.setup import attach as attach_runtime

    return attach_runtime(app, config, pool)


__all__ = ["AutoscaleConfig", "HoldSettings", "add_arguments", "attach", "config_from_args", "config_from_mapping"]
