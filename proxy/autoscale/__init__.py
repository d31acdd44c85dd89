"""The autoscaler that runs inside the proxy: signals, the decision loop, actuators, holding
requests while the fleet scales from zero, and its metrics.

The proxy calls two things::

    from proxy.autoscale import add_arguments, attach, config_from_args
    add_arguments(parser)                      # --autoscale SPEC, --actuator, --engine-cmd, ...
    config = config_from_args(args)            # None when no autoscaler is asked for
    if config is not None:
        attach(app, config)                    # after build_app(), before the app starts
"""

from proxy.autoscale.config import AutoscaleConfig, add_arguments, config_from_args, config_from_mapping
from proxy.autoscale.setup import AUTOSCALER_KEY, AutoscaleRuntime, attach

__all__ = ["AUTOSCALER_KEY", "AutoscaleConfig", "AutoscaleRuntime", "add_arguments", "attach", "config_from_args",
           "config_from_mapping"]
