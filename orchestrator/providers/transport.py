"""HTTP for provider adapters: auth header, timeouts, throttling, bounded retries (docs/providers.md).

The only module of ``providers`` that catches httpx exceptions; everything leaves as a gpuq
``ProviderError``.  Retried: network errors, timeouts, HTTP 429 and 5xx, with exponential backoff and
jitter, honouring ``Retry-After``, at most ``RetryPolicy.tries`` attempts.  Never retried: any other
4xx (auth, validation) and provider errors the adapter recognises.

Create calls are not blindly retried (docs/providers.md): :meth:`ApiTransport.retrying` takes an
``adopt`` callback that lists the account's instances and returns one already carrying the requested
name; it runs after every failure that may have been applied server-side, before trying again.

The API key goes into the ``Authorization`` header of each request and nowhere else; log lines carry
method, path and status only, and server-supplied text is scrubbed of the key before it reaches an
exception message.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from orchestrator.core.errors import CreateUnknown, ProviderAuthError, ProviderError, ProviderUnreachable, RateLimited
from orchestrator.providers.credentials import ApiKey, ProviderSpec, how_to_set

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0  # reads and mutations (docs/providers.md)
TERMINATE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """``tries`` attempts in all; the n-th retry waits ``first_delay_s * 2**(n-1)`` (± ``jitter``) capped at
    ``max_delay_s``, or the server's ``Retry-After`` (also capped) when it sent one."""

    tries: int = 6
    first_delay_s: float = 1.0
    max_delay_s: float = 60.0
    jitter: float = 0.2

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay_s)
        base: float = min(self.max_delay_s, self.first_delay_s * 2.0 ** max(retry - 1, 0))
        if self.jitter:
            base *= 1.0 + rng.uniform(-self.jitter, self.jitter)
        return max(0.0, min(self.max_delay_s, base))


class Transient(Exception):
    """A failure worth retrying.  ``error`` is raised when the tries run out; ``maybe_applied`` says the
    server may have carried the request out (sent, then timeout / 429 / 5xx)."""

    def __init__(self, error: ProviderError, *, retry_after: float | None = None, maybe_applied: bool = True) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after
        self.maybe_applied = maybe_applied


def json_object(value: object) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (for optional nested fields)."""
    return value if isinstance(value, dict) else {}


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


class _KeyAuth(httpx.Auth):
    """Adds ``Authorization: Bearer <key>`` per request; its repr never shows the key."""

    def __init__(self, key: ApiKey) -> None:
        self._key = key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._key.reveal()}"
        yield request

    def __repr__(self) -> str:
        return f"_KeyAuth({self._key!r})"


class ApiTransport:
    """One provider account's HTTP client.  Thread-compatible, not thread-safe (one per caller)."""

    def __init__(
        self,
        spec: ProviderSpec,
        base_url: str,
        key: ApiKey,
        *,
        policy: RetryPolicy,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        min_interval_s: float = 0.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.policy = policy
        self.timeout_s = timeout_s
        self.min_interval_s = min_interval_s
        self.sleep = sleep
        self.clock = clock
        self.rng = rng or random.Random()
        self.log = logging.getLogger(f"orchestrator.providers.{spec.name}")
        self._last: dict[str, float] = {}
        # An injected transport (tests, replays) carries every request: proxy variables must not reroute it.
        self._client = httpx.Client(auth=_KeyAuth(key), transport=transport, follow_redirects=False,
                                    trust_env=transport is None,
                                    headers={"User-Agent": "gpuq", "Accept": "application/json"})

    def __repr__(self) -> str:
        return f"ApiTransport({self.spec.name}, {self.base_url}, key {self.key!r})"

    def close(self) -> None:
        self._client.close()

    # -- pacing -------------------------------------------------------------------------------

    def throttle(self, lane: str, interval_s: float) -> None:
        """Keep calls in ``lane`` at least ``interval_s`` apart (client-side rate limit)."""
        if interval_s <= 0:
            return
        last = self._last.get(lane)
        if last is not None:
            wait = last + interval_s - self.clock()
            if wait > 0:
                self.log.debug("pacing %s calls: waiting %.2f s", lane, wait)
                self.sleep(wait)
        self._last[lane] = self.clock()

    def backoff(self, retry: int, retry_after: float | None) -> None:
        delay = self.policy.delay(retry, retry_after, self.rng)
        if retry_after is not None:
            self.log.info("rate limited: the provider asked to wait %.1f s; waiting %.1f s", retry_after, delay)
        else:
            self.log.info("backing off %.1f s before retry %d", delay, retry)
        self.sleep(delay)

    # -- messages -----------------------------------------------------------------------------

    def scrub(self, text: str, limit: int = 300) -> str:
        """Server text made safe for an exception: key removed, one line, bounded length."""
        clean = " ".join(self.key.scrub(text).split())
        return clean if len(clean) <= limit else clean[: limit - 3] + "..."

    def auth_error(self, status: int | None, detail: str, code: str = "") -> ProviderAuthError:
        said = f": {self.scrub(detail).rstrip('.')}" if detail else ""
        where = f" (HTTP {status})" if status else ""
        return ProviderAuthError(
            self.spec.label,
            f"the API key from {self.key.source} was rejected{where}{said}; {how_to_set(self.spec)}",
            code=code or "auth", status=status)

    # -- requests -----------------------------------------------------------------------------

    def request_once(self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None,
                     what: str = "") -> httpx.Response:
        """One HTTP exchange.  Raises Transient (network, timeout, 429, 5xx), ProviderAuthError (401);
        returns any other response for the adapter to judge."""
        self.throttle("any", self.min_interval_s)
        label = what or path or "/"
        url = self.base_url + path
        started = self.clock()
        try:
            response = self._client.request(method, url, json=json, timeout=timeout_s or self.timeout_s)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            self.log.debug("%s %s: cannot connect (%s)", method, label, type(exc).__name__)
            raise Transient(ProviderUnreachable(self.spec.label, f"cannot connect to {self.base_url} ({label})",
                                                code="connect"), maybe_applied=False) from None
        except httpx.TimeoutException as exc:
            self.log.debug("%s %s: timed out (%s)", method, label, type(exc).__name__)
            raise Transient(ProviderUnreachable(
                self.spec.label, f"{label} timed out after {timeout_s or self.timeout_s:.0f} s; outcome unknown",
                code="timeout")) from None
        except httpx.TransportError as exc:
            self.log.debug("%s %s: transport error (%s)", method, label, type(exc).__name__)
            raise Transient(ProviderUnreachable(self.spec.label, f"{label}: connection failed ({type(exc).__name__})",
                                                code="network")) from None
        status = response.status_code
        self.log.debug("%s %s -> %d (%.2f s)", method, label, status, self.clock() - started)
        if status == 429:
            wait = parse_retry_after(response.headers.get("Retry-After"))
            raise Transient(RateLimited(self.spec.label, f"{label}: rate limited (HTTP 429) on every try",
                                        code="429", status=429), retry_after=wait)
        if status >= 500:
            raise Transient(ProviderUnreachable(
                self.spec.label, f"{label}: HTTP {status}: {self.scrub(response.text, 200)}",
                code=str(status), status=status))
        if status == 401:
            raise self.auth_error(401, self._error_text(response), code=self._error_code(response))
        return response

    def request(self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None,
                what: str = "") -> httpx.Response:
        """:meth:`request_once` retried with backoff; for calls that are safe to repeat."""
        return self.retrying(lambda: self.request_once(method, path, json=json, timeout_s=timeout_s, what=what))

    def retrying(self, attempt: Callable[[], T], *, adopt: Callable[[], T | None] | None = None,
                 repeat_applied: bool = True) -> T:
        """Run ``attempt`` up to ``policy.tries`` times while it raises Transient.  After a failure that
        may have been applied server-side, ``adopt()`` is asked first; a non-None answer is the result.
        ``repeat_applied`` False (an instance create): after a server error or timeout that ``adopt`` cannot
        resolve, the call is never repeated (a lagging listing would make it a second machine): CreateUnknown.
        A 429 is a refusal, repeated after the same check."""
        tries = max(1, self.policy.tries)
        for number in range(1, tries + 1):
            try:
                return attempt()
            except Transient as failure:
                if adopt is not None and failure.maybe_applied:
                    adopted = adopt()
                    if adopted is not None:
                        self.log.info("adopted a resource created by a call that failed client-side")
                        return adopted
                    if not repeat_applied and not isinstance(failure.error, RateLimited):
                        error = failure.error
                        said = str(error).removeprefix(f"{error.provider}: ")
                        raise CreateUnknown(error.provider, f"{said}; no instance carries its name yet: it may "
                                            "have been created", code="create-unknown", status=error.status) from None
                if number == tries:
                    raise failure.error from None
                self.log.info("%s; retry %d of %d", failure.error, number, tries - 1)
                self.backoff(number, failure.retry_after)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def json_body(response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            return None

    def _error_text(self, response: httpx.Response) -> str:
        body = self.json_body(response)
        if isinstance(body, dict):
            err = body.get("error")
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                return str(err["message"])
            if isinstance(err, str):
                return err
            if isinstance(body.get("detail"), str):  # RFC 9457 problem details (RunPod v2)
                return str(body["detail"])
            errors = body.get("errors")
            if isinstance(errors, list) and errors and isinstance(errors[0], dict):
                return str(errors[0].get("message", ""))
        return response.text[:200]

    def _error_code(self, response: httpx.Response) -> str:
        body = self.json_body(response)
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            code = body["error"].get("code")
            if isinstance(code, str):
                return code
        return ""
