"""The request path's records as msgspec Structs, built in C: several times cheaper to make than
dataclasses.

They live apart from the modules that use them because those modules can be compiled with mypyc
(`make compiled`, docs/benchmarks.md), and these four, defined in a compiled module, fail at
import with mypyc 2.4 (three crash; `ResponseHead` raises a TypeError on `msgspec.field`). This
module stays plain Python in either build."""
from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from policies.routing.base import RequestInfo
    from proxy.config import BackendSpec
    from proxy.pool import Backend
    from proxy.upstream import Target


class RequestStart(msgspec.Struct, frozen=True):
    """A request's first lines to one backend on one route, and what else depends on the backend
    alone (`proxy.fastpath.RequestStarts`)."""

    spec: BackendSpec
    """The spec they were made from: a spec replaced under the same URL makes them again."""
    target: Target
    lines: bytes
    """The request line, Host, and the backend's own Authorization when it has credentials."""
    backend_line: bytes
    """The answer's `x-flotilla-backend` line."""
    own_authorization: bool


class Reservation(msgspec.Struct):
    """What one request holds on its backend from pick time until its last byte."""

    backend: Backend
    tokens: int
    """Estimated prompt plus max tokens."""
    scrape_epoch: int
    """The backend's scrape epoch at pick time: if no scrape ended since, the engine's own
    counters do not include this request yet."""
    released: bool = False


class Forward(msgspec.Struct, frozen=True):
    """What to send upstream for one client request (a msgspec Struct: built in C, several
    times faster than a dataclass; `msgspec.structs.replace` makes a changed copy)."""

    method: str
    path_qs: str
    """Path and query string, the same on the backend as on the proxy."""
    body: bytes
    info: RequestInfo
    debug: bool = False
    """Client sent x-flotilla-debug: 1: answer with the deciding rule too."""
    accounts_usage: bool = False
    """A completions or chat request: read usage from the response for prefill accounting."""
    strip_usage: bool = False
    """The proxy added stream_options.include_usage: drop the usage event before the client."""
    flavors: frozenset[str] | None = None
    """Only backends of these flavors serve the route (None: every backend)."""
    request_id: str | None = None
    """The X-Request-Id already given to this request (P/D: its prefill phase's); None: the
    client's, else a new one."""


class ResponseHead(msgspec.Struct):
    """An engine's response head, read once as it arrives."""

    status: int
    reason: str
    headers: list[tuple[bytes, bytes]]
    """As sent, names in their case."""
    content_type: str = ""
    """The media type, lower case, without parameters."""
    event_stream: bool = False
    """The media type is text/event-stream."""
    content_length: int | None = None
    chunked: bool = False
    retry_after: str | None = None
    """The first Retry-After value."""
    connection: str | None = None
    """Every Connection field's options, joined (read in the same pass as the fields above)."""
    relayed: list[tuple[bytes, bytes]] = msgspec.field(default_factory=list)
    """`headers` less those named in the pool's `not_relayed` (read in the same pass)."""

