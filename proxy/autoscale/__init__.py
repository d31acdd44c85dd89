"""The autoscaler that runs inside the proxy: signals, the decision loop, actuators, holding
requests while the fleet scales from zero, and its metrics."""
