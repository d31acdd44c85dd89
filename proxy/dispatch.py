"""One client request: pick, reserve, forward, retry before the first byte, relay, account.

Retries go to a backend not tried yet, after a capped exponential backoff with jitter (longer
when a backend sent Retry-After), and only while nothing has reached the client. Once the
response headers went out, a failure ends the stream with an error event instead. A connection
that drops after the request was sent is retried too: every forwarded route (proxy/paths.py) is
safe to send twice. Routes with side effects in an engine (LoRA loading and the like) are not
forwarded at all.

Each attempt's outcome goes to the backend's circuit breaker: only the backend's faults count
against it (`breaker.outcome_of_status`); a client that went away or stopped reading does not.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from policies.routing.base import BackendState, Decision
from proxy.breaker import SUCCESS, Outcome, outcome_of_status
from proxy.config import ProxyConfig
from proxy.errors import ProxyError, error_response, speaks_anthropic
from proxy.forward import (
    RelayResult,
    UpstreamFailure,
    downstream_headers,
    drop_client,
    end_broken_stream,
    is_event_stream,
    is_small_whole_body,
    new_request_id,
    open_upstream,
    read_whole,
    relay,
    send_whole,
    upstream_headers,
    with_credentials,
)
from proxy.metrics import RouterMetrics
from proxy.pool import Backend, BackendPool
from proxy.records import Forward, Reservation
from proxy.retry import is_retryable_status, parse_retry_after_s, wait_before_retry_s
from proxy.router import Router
from proxy.server import cut_by_shutdown
from proxy.usage import usage_from_json, usage_from_sse_tail

U = TypeVar("U")
"""One attempt's answer as the request path holds it (aiohttp's response, the fast path's attempt)."""
T = TypeVar("T")
MAX_ERROR_BODY_BYTES = 64 * 1024
CLIENT_GONE_STATUS = 499
"""The status label of an answer whose client went away before its end (nginx's code)."""
SHUTDOWN_CUT_STATUS = 503
"""The status label of an answer the proxy's shutdown cut: what the client was told (a final
error event with code 503, or a 503)."""


@dataclass
class RetryableAnswer:
    """A backend's retryable error answer, kept in case no other backend does better."""

    status: int
    headers: dict[str, str]
    body: bytes
    backend: Backend


def unfinished_status(result: RelayResult) -> int:
    """The status label of an answer that did not reach its end, by whose doing (pure)."""
    if result.client_gone:
        return CLIENT_GONE_STATUS
    if result.cut_by_shutdown:
        return SHUTDOWN_CUT_STATUS
    return 502  # the backend broke off


class Dispatcher:
    def __init__(self, config: ProxyConfig, pool: BackendPool, router: Router,
                 session: aiohttp.ClientSession, metrics: RouterMetrics, rng: random.Random,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.pool = pool
        self.router = router
        self.session = session
        self.metrics = metrics
        self.rng = rng
        self.clock = clock
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # made outside a loop (tests): looked up when needed
            self.loop = None

    async def handle(self, request: web.Request, fwd: Forward) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.config.timeouts.total_s
        request_id = fwd.request_id or request.headers.get("x-request-id") or new_request_id()
        # With client keys set, the client's Authorization is its key to the proxy: never forwarded.
        headers = upstream_headers(request.headers, request_id, drop_authorization=bool(self.config.limits.api_keys))
        return await self.attempts(
            fwd,
            send=lambda backend: open_upstream(self.session, fwd.method, backend.url + fwd.path_qs,
                                               with_credentials(headers, backend.spec.authorization), fwd.body,
                                               self.config.timeouts, deadline),
            head_of=lambda upstream: (upstream.status, upstream.headers.get("Retry-After")),
            keep=self._keep_answer,
            relay=lambda upstream, backend, decision, reservation: self._relay(
                request, fwd, upstream, backend, decision, reservation, request_id, start, deadline),
            give_up=lambda tried, failure, answer: self._give_up(fwd, tried, failure, answer, request_id, start))

    async def attempts(self, fwd: Forward, send: Callable[[Backend], Awaitable[U]],
                       head_of: Callable[[U], tuple[int, str | None]],
                       keep: Callable[[U, Backend, Reservation], Awaitable[RetryableAnswer]],
                       relay: Callable[[U, Backend, Decision, Reservation], Awaitable[T]],
                       give_up: Callable[[list[Backend], UpstreamFailure | None, RetryableAnswer | None], T]) -> T:
        """The retry loop of both request paths (aiohttp's here, proxy/fastpath.py's): pick a backend
        not tried yet, reserve, `send`; a failure before the answer's head, or a retryable status
        (its answer kept by `keep` in case no other backend does better), moves on to the next
        after a backoff; the first other answer goes to `relay`, and `give_up` answers when none is
        left. `head_of` reads an answer's status and Retry-After."""
        tried: list[Backend] = []
        failure: UpstreamFailure | None = None
        answer: RetryableAnswer | None = None
        retry_after_s: float | None = None
        for attempt in range(self.config.retry.max_attempts):
            exclude = [*tried, *self._not_serving(fwd)] if tried or fwd.flavors is not None else ()
            picked = self.router.pick(fwd.info, self.clock(), exclude=exclude)
            if picked is None:
                break
            if attempt:
                # after a failed attempt: a failure, or else a retryable answer
                self.metrics.retries.labels(failure.reason if failure else f"status_{answer.status}").inc()  # type: ignore[union-attr]
                await asyncio.sleep(wait_before_retry_s(self.config.retry, attempt, self.rng, retry_after_s))
            backend, decision = picked
            tried.append(backend)
            reservation = self.pool.reserve(backend, fwd.info.prompt_tokens + (fwd.info.max_tokens or 0))
            try:
                upstream = await send(backend)
            except UpstreamFailure as exc:
                self.pool.release(reservation)
                self._record(backend, Outcome.FAILURE)
                failure, answer, retry_after_s = exc, None, None
                if not exc.retryable:
                    break
                continue
            except BaseException:
                self.pool.release(reservation)
                self._record(backend, Outcome.NEUTRAL)
                raise
            status, retry_after = head_of(upstream)
            if is_retryable_status(status):
                answer = await keep(upstream, backend, reservation)
                failure, retry_after_s = None, parse_retry_after_s(retry_after, time.time())
                continue
            return await relay(upstream, backend, decision, reservation)
        return give_up(tried, failure, answer)

    def _not_serving(self, fwd: Forward) -> list[Backend]:
        """Backends whose flavor does not serve the route."""
        return [] if fwd.flavors is None else [b for b in self.pool if b.spec.flavor not in fwd.flavors]

    async def _keep_answer(self, upstream: aiohttp.ClientResponse, backend: Backend,
                           reservation: Reservation) -> RetryableAnswer:
        try:
            async with asyncio.timeout(self.config.timeouts.idle_s):
                body = await upstream.content.read(MAX_ERROR_BODY_BYTES)
        except (TimeoutError, aiohttp.ClientError):
            body = b""
        finally:
            upstream.close()
            self.pool.release(reservation)
        return self.kept(backend, upstream.status, dict(downstream_headers(upstream.headers)), body)

    def kept(self, backend: Backend, status: int, headers: dict[str, str], body: bytes) -> RetryableAnswer:
        """A retryable answer, judged against its backend and kept in case no other does better."""
        if status == 503 and b"Loading model" in body:
            # llama-server reloading: starting again, not broken (the health probe says when it is back)
            if backend.state is BackendState.READY:
                backend.state = BackendState.STARTING
            self._record(backend, Outcome.NEUTRAL)
        else:
            self._record(backend, outcome_of_status(status))
        return RetryableAnswer(status, headers, body, backend)

    def no_attempt_left(self, fwd: Forward, tried: list[Backend], failure: UpstreamFailure | None,
                        answer: RetryableAnswer | None, elapsed_s: float) -> tuple[ProxyError | None, str]:
        """Count a request no attempt served: None when the kept `answer` goes back as it is, else
        the error to answer with; and the backend to name in `x-flotilla-backend`."""
        model = self.pool.model_label(fwd.info.model)
        if answer is not None:
            self.metrics.request_done(model, answer.backend.url, answer.status, elapsed_s)
            return None, answer.backend.url
        if failure is not None:
            err = ProxyError(failure.status, f"The backend failed before answering ({failure.reason}).")
            backend = tried[-1].url
        else:
            err = ProxyError(503, "No backend is available to serve this request.", headers={"Retry-After": "1"})
            backend = ""
        self.metrics.request_done(model, backend, err.status, elapsed_s)
        return err, backend

    def _give_up(self, fwd: Forward, tried: list[Backend], failure: UpstreamFailure | None,
                 answer: RetryableAnswer | None, request_id: str, start: float) -> web.Response:
        err, backend = self.no_attempt_left(fwd, tried, failure, answer, asyncio.get_running_loop().time() - start)
        if err is None:
            assert answer is not None
            headers = {**answer.headers, "x-flotilla-backend": backend, "X-Request-Id": request_id}
            return web.Response(status=answer.status, headers=headers, body=answer.body)
        return error_response(err, {"X-Request-Id": request_id, "x-flotilla-backend": backend},
                              speaks_anthropic(fwd.path_qs.split("?", 1)[0]))

    @staticmethod
    def _response_headers(upstream: aiohttp.ClientResponse, backend: Backend, decision: Decision,
                          request_id: str, debug: bool) -> CIMultiDict[str]:
        headers = downstream_headers(upstream.headers)
        headers["x-flotilla-backend"] = backend.url
        headers["X-Request-Id"] = request_id
        if debug:
            headers["x-flotilla-rule"] = decision.rule
        return headers

    async def _relay(self, request: web.Request, fwd: Forward, upstream: aiohttp.ClientResponse,
                     backend: Backend, decision: Decision, reservation: Reservation, request_id: str,
                     start: float, deadline: float) -> web.StreamResponse:
        headers = self._response_headers(upstream, backend, decision, request_id, fwd.debug)
        if is_small_whole_body(upstream):
            whole = await self._answer_whole(request, fwd, upstream, backend, decision, reservation, headers, start,
                                             deadline)
            self._client_ended(request, await send_whole(request, whole, self.config.timeouts))
            return whole
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        if upstream.content_length is not None and not is_event_stream(upstream):
            response.content_length = upstream.content_length
        result = RelayResult(completed=False)
        try:
            await response.prepare(request)
            result = await relay(request, response, upstream, self.config.timeouts, deadline, fwd.accounts_usage,
                                 strip_usage=fwd.strip_usage and is_event_stream(upstream))
            if result.error is not None:
                await end_broken_stream(request, response, upstream, result, self.config.timeouts)
            elif not result.client_gone:
                self._client_ended(request, await send_whole(request, response, self.config.timeouts))
            return response
        except ConnectionResetError:  # the client left before the headers went out
            result.client_gone = True
            return response
        except asyncio.CancelledError:
            self._cancelled(request, result)
            raise
        finally:
            # Closing (not releasing) an unfinished response drops the connection, which is how
            # the engine learns the client went away and aborts the request.
            upstream.release() if result.completed else upstream.close()
            self.pool.release(reservation)
            self._finish(fwd, upstream.status, is_event_stream(upstream), backend, decision, result, start)
            self._client_ended(request, result)

    def _client_ended(self, request: web.Request, result: RelayResult) -> None:
        """Count a client that left or stopped reading; drop the one that stopped."""
        if result.client_stalled:
            drop_client(request)
        if result.client_gone:
            self.metrics.client_disconnects.inc()

    @staticmethod
    def _cancelled(request: web.Request, result: RelayResult) -> None:
        """The handler was cancelled: shutdown cut it, or else its client went away."""
        if cut_by_shutdown(request):
            result.cut_by_shutdown = True
        else:
            result.client_gone = True

    async def _answer_whole(self, request: web.Request, fwd: Forward, upstream: aiohttp.ClientResponse,
                            backend: Backend, decision: Decision, reservation: Reservation,
                            headers: CIMultiDict[str], start: float, deadline: float) -> web.Response:
        result = RelayResult(completed=False)
        try:
            result = await read_whole(upstream, self.config.timeouts, deadline)
            if result.error is not None:  # nothing reached the client yet: answer with an error
                raise ProxyError(502, f"The backend failed mid-response: {result.error}.",
                                 headers={"x-flotilla-backend": backend.url})
            return web.Response(status=upstream.status, reason=upstream.reason, headers=headers, body=result.body)
        except asyncio.CancelledError:
            self._cancelled(request, result)
            raise
        finally:
            upstream.release() if result.completed else upstream.close()
            self.pool.release(reservation)
            self._finish(fwd, upstream.status, is_event_stream(upstream), backend, decision, result, start)

    def _finish(self, fwd: Forward, upstream_status: int, event_stream: bool, backend: Backend, decision: Decision,
                result: RelayResult, start: float) -> None:
        """Account one relayed answer: metrics, the backend's circuit, usage."""
        loop = self.loop or asyncio.get_running_loop()
        model = self.pool.model_label(fwd.info.model)
        status = upstream_status if result.completed else unfinished_status(result)
        ttft_s = result.first_byte_at_s - start if result.first_byte_at_s is not None else None
        self.metrics.request_done(model, backend.url, status, loop.time() - start, ttft_s)
        if result.error is not None:
            outcome = Outcome.FAILURE
        else:
            outcome = outcome_of_status(upstream_status) if result.completed else Outcome.NEUTRAL
        self._record(backend, outcome)
        if result.completed and fwd.accounts_usage and upstream_status == 200:
            self._account_usage(fwd, event_stream, backend, decision, result)

    def _account_usage(self, fwd: Forward, event_stream: bool, backend: Backend, decision: Decision,
                       result: RelayResult) -> None:
        if result.tail.find(b'"usage"') < 0:  # not `in`: bytes.__contains__ tries an int first, and raises
            return
        usage = usage_from_sse_tail(result.tail) if event_stream else (
            usage_from_json(result.body) if result.body is not None else None)
        if usage is None:
            return
        backend.prefill_tokens += usage.prefill_tokens
        if decision.predicted_cached_tokens is not None and usage.reports_cache:
            self.metrics.prefix_prediction(backend.url, decision.predicted_cached_tokens, usage.cached_tokens)
        if self.router.wants_feedback:
            self.router.feedback(backend, fwd.info, self.clock(), usage.prompt_tokens, usage.cached_tokens)

    def _record(self, backend: Backend, outcome: Outcome) -> None:
        if outcome is SUCCESS:  # the common case reads no clock
            self.pool.record_success(backend)
        elif self.pool.record(backend, outcome, self.clock()):
            self.metrics.ejections.labels(backend.url).inc()
