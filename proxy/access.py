"""Who may use the proxy: client API keys, per-key rate limits, and which backends the admin API
may register (so the proxy cannot be made into an open relay to any address)."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import time
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import urlsplit

from aiohttp import web

from proxy.admin import check_token, header_bytes
from proxy.errors import ProxyError
from proxy.limits import LimitsConfig
from proxy.ratelimit import RateLimiter, client_id, retry_after_header
from proxy.request_parse import load_json_object

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def client_key(headers: Mapping[str, str]) -> str | None:
    """The client's API key: `Authorization: Bearer <key>`, else `x-api-key: <key>` as Anthropic's
    clients send it."""
    return bearer(headers) or headers.get("x-api-key", "").strip() or None


def key_is_valid(given: str | None, keys: tuple[str, ...]) -> bool:
    # Compare against every key so the time taken does not tell which prefix matched.
    matches = [hmac.compare_digest(header_bytes(given or ""), k.encode()) for k in keys]
    return given is not None and any(matches)


def address_allowed(address: str, networks: tuple[Network, ...]) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in n for n in networks)


async def resolve(host: str) -> list[str]:
    """Every address `host` names (itself when it is an address literal)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, None)
    return sorted({str(info[4][0]) for info in infos})


async def check_backend_url(url: object, networks: tuple[Network, ...]) -> None:
    """403 unless every address of `url`'s host lies in `networks`."""
    if not isinstance(url, str):
        return  # the admin API itself answers the missing or malformed url
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return  # the admin API itself answers the malformed url
    if not host:
        return
    try:
        addresses = await resolve(host)
    except (OSError, ValueError):  # ValueError: a name IDNA cannot encode (an over-long label)
        raise ProxyError(400, f"The backend host {host!r} does not resolve.", param="url") from None
    if not addresses or not all(address_allowed(a, networks) for a in addresses):
        raise ProxyError(403, f"The backend host {host!r} is outside the allowed networks "
                              f"({', '.join(str(n) for n in networks)}); see --backend-network.", param="url")


class AccessControl:
    """The proxy's middleware for keys, rate limits and the admin allow-list."""

    def __init__(self, limits: LimitsConfig, admin_token: str | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.admin_token = admin_token
        self.clock = clock
        self.limiter = self._limiter()
        self.failed_auth = self._limiter()
        """Failed key checks per client address: a guesser is slowed to the rate limit too."""

    def _limiter(self) -> RateLimiter | None:
        lim = self.limits
        return RateLimiter(lim.rate_limit_rps, lim.rate_limit_burst, lim.max_rate_limit_keys) \
            if lim.rate_limit_rps is not None else None

    @property
    def checks_clients(self) -> bool:
        """Clients need a key or have a rate limit (else `check_client` has nothing to do)."""
        return bool(self.limits.api_keys) or self.limiter is not None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1/") and self.checks_clients:
            self.check_client(request.headers, request.remote)
        elif request.path == "/admin/backends" and request.method == "POST":
            check_token(request, self.admin_token)
            await self._check_new_backend(request)
        return await handler(request)

    def check_client(self, headers: Mapping[str, str], remote: str | None) -> None:
        """The client's key and rate limit on a /v1/ route: ProxyError (401, 429) when refused."""
        key = client_key(headers)
        address = client_id(remote)
        if self.limits.api_keys:
            self._check_key(key, address)
        if self.limiter is None:
            return
        # with API keys, _check_key has refused a request without one
        wait_s = self.limiter.take(key if self.limits.api_keys else address, self.clock())  # type: ignore[arg-type]
        if wait_s > 0:
            raise rate_limited("Rate limit exceeded for this API key.", wait_s)

    def _check_key(self, key: str | None, address: str) -> None:
        """401 for a missing or wrong key; with a rate limit set, an address whose failed
        attempts used up its bucket gets 429 for every request until it refills, right key or
        not, so guessing runs at the rate limit at most."""
        if self.failed_auth is not None:
            wait_s = self.failed_auth.wait_s(address, self.clock())
            if wait_s > 0:
                raise rate_limited("Too many requests with a missing or wrong API key from this address.", wait_s)
        if key_is_valid(key, self.limits.api_keys):
            return
        if self.failed_auth is not None:
            self.failed_auth.take(address, self.clock())
        raise ProxyError(401, "A valid API key is required (Authorization: Bearer <key>).",
                         code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def _check_new_backend(self, request: web.Request) -> None:
        try:
            body = load_json_object(await request.read())
        except ProxyError:
            return  # the admin API answers the malformed body
        await check_backend_url(body.get("url"), self.limits.networks)


def rate_limited(message: str, wait_s: float) -> ProxyError:
    return ProxyError(429, message, code="rate_limit_exceeded", headers={"Retry-After": retry_after_header(wait_s)})
