"""Limits that keep the proxy serving under overload and abuse (one config for admission, rate
limits, client keys, the backend allow-list, slow clients and shutdown)."""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK_NETWORKS = ("127.0.0.0/8", "::1/128")


def _error(field_name: str, value: object, reason: str) -> Exception:
    from proxy.config import ConfigError  # proxy.config imports this module

    return ConfigError(field_name, value, reason)


@dataclass
class LimitsConfig:
    """Admission, rate and access limits; the defaults keep a single-user local proxy unhindered."""

    max_in_flight_per_model: int = 512
    """Requests of one model forwarded at once; more wait in the model's queue."""
    max_queued_per_model: int = 1024
    """Requests of one model waiting for a slot; one more is answered 429 with Retry-After."""
    queue_timeout_s: float = 60.0
    """Longest wait in the queue before a 503."""
    api_keys: tuple[str, ...] = ()
    """Bearer keys clients must send on /v1/*; empty: no key needed."""
    rate_limit_rps: float | None = None
    """Requests per second allowed per API key (or per client address without keys); None: no limit."""
    rate_limit_burst: float = 20.0
    """Token-bucket depth: requests a key may send at once after being idle."""
    max_rate_limit_keys: int = 10_000
    """Buckets kept at most (least recently used dropped first), so clients cannot grow memory."""
    backend_networks: tuple[str, ...] = LOOPBACK_NETWORKS
    """Networks a backend registered through the admin API may be in (CIDR)."""
    shutdown_grace_s: float = 30.0
    """After SIGTERM, how long in-flight requests may run before they are cut and the proxy exits."""
    header_timeout_s: float = 10.0
    """A request's headers must be complete this long after the connection opened or the
    request's first byte arrived; else 408 and the connection is closed."""
    body_timeout_s: float = 60.0
    """A request's whole body must arrive within this once its headers are in; else 408."""
    keepalive_timeout_s: float = 75.0
    """An idle keep-alive connection is closed after this (longer than the 60 s idle timeout of
    common load balancers, so they close first)."""
    max_connections_per_client: int = 1024
    """Open connections per client address (IPv6: per /64); new ones past it are closed at once.
    0: no cap (behind a reverse proxy every client shares its address)."""
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("max_in_flight_per_model", "max_rate_limit_keys"):
            if getattr(self, name) < 1:
                raise _error(name, getattr(self, name), "must be >= 1")
        if self.max_queued_per_model < 0:
            raise _error("max_queued_per_model", self.max_queued_per_model, "must be >= 0")
        for name in ("queue_timeout_s", "rate_limit_burst", "header_timeout_s", "body_timeout_s",
                     "keepalive_timeout_s"):
            if not getattr(self, name) > 0:
                raise _error(name, getattr(self, name), "must be > 0")
        if self.rate_limit_rps is not None and not self.rate_limit_rps > 0:
            raise _error("rate_limit_rps", self.rate_limit_rps, "must be > 0")
        if self.shutdown_grace_s < 0:
            raise _error("shutdown_grace_s", self.shutdown_grace_s, "must be >= 0")
        if self.max_connections_per_client < 0:
            raise _error("max_connections_per_client", self.max_connections_per_client, "must be >= 0")
        if any(not k.strip() for k in self.api_keys):
            raise _error("api_keys", "<empty>", "keys must not be empty")
        try:
            self.networks = tuple(ipaddress.ip_network(n, strict=False) for n in self.backend_networks)
        except ValueError as exc:
            raise _error("backend_networks", self.backend_networks, str(exc)) from None


def read_keys_file(path: Path) -> tuple[str, ...]:
    """One key per line; blank lines and `#` comments are skipped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line)


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    d = LimitsConfig()
    g = parser.add_argument_group("limits and access")
    g.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="a client key required on /v1/* as Authorization: Bearer KEY; repeat for more")
    g.add_argument("--api-keys-file", type=Path, default=None, help="client keys, one per line")
    g.add_argument("--rate-limit-rps", type=float, default=None, help="requests/s per API key (default: none)")
    g.add_argument("--rate-limit-burst", type=float, default=d.rate_limit_burst)
    g.add_argument("--max-in-flight-per-model", type=int, default=d.max_in_flight_per_model)
    g.add_argument("--max-queued-per-model", type=int, default=d.max_queued_per_model,
                   help="waiting requests per model before 429 (default %(default)s)")
    g.add_argument("--queue-timeout-s", type=float, default=d.queue_timeout_s)
    g.add_argument("--backend-network", action="append", default=None, metavar="CIDR",
                   help="network admin-registered backends may be in; repeat (default loopback only)")
    g.add_argument("--shutdown-grace-s", type=float, default=d.shutdown_grace_s,
                   help="after SIGTERM, time in-flight requests get to finish (default %(default)s)")
    g.add_argument("--header-timeout-s", type=float, default=d.header_timeout_s,
                   help="time a client gets to send a request's headers, then 408 (default %(default)s)")
    g.add_argument("--body-timeout-s", type=float, default=d.body_timeout_s,
                   help="time a client gets to send a request's body, then 408 (default %(default)s)")
    g.add_argument("--keepalive-timeout-s", type=float, default=d.keepalive_timeout_s,
                   help="idle keep-alive connections are closed after this (default %(default)s)")
    g.add_argument("--max-connections-per-client", type=int, default=d.max_connections_per_client,
                   help="open connections per client address, IPv6 per /64; 0: no cap (default %(default)s)")


def limits_from_args(args: argparse.Namespace) -> LimitsConfig:
    keys = tuple(args.api_key) + (read_keys_file(args.api_keys_file) if args.api_keys_file else ())
    return LimitsConfig(
        max_in_flight_per_model=args.max_in_flight_per_model, max_queued_per_model=args.max_queued_per_model,
        queue_timeout_s=args.queue_timeout_s, api_keys=keys, rate_limit_rps=args.rate_limit_rps,
        rate_limit_burst=args.rate_limit_burst,
        backend_networks=tuple(args.backend_network) if args.backend_network else LOOPBACK_NETWORKS,
        shutdown_grace_s=args.shutdown_grace_s, header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s, keepalive_timeout_s=args.keepalive_timeout_s,
        max_connections_per_client=args.max_connections_per_client)
