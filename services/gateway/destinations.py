"""Webhook destinations, looked up before the request's transaction.

Creating or changing a job (or a workflow) with a webhook target checks its
URL against the SSRF rules (cronwheel.core.ssrf), which needs a DNS lookup.
The lookup happens here, before `Gateway.as_tenant` takes a pooled connection
and opens the transaction, and within `timeout_s`: a slow resolver then holds
no connection, no transaction and no row lock, and the request waits at most
that long for it.

The verdicts are applied inside the transaction (`Verdicts.check`), where the
check used to run: a refused destination is the same 422 DESTINATION_REFUSED
at the same point, so a request with an Idempotency-Key records it, and a
replay is answered from the record before any verdict is looked at. A lookup
that did not answer in time is raised before the transaction
(`Verdicts.raise_timeout`): 503 DNS_TIMEOUT naming the field, with
Retry-After. 503 rather than 422 because the body is not at fault: the same
request may pass a second later, and a 503 is never recorded against its
Idempotency-Key, so the client's retry with the same key is checked afresh.
(In a batch, a job whose lookup timed out gets that 503 in its own slot; the
batch's answer, that slot included, is what its Idempotency-Key records.)

Lookups run on a small pool of threads of this process (getaddrinfo blocks and
has no timeout of its own); the distinct hosts of a request are looked up
together, all within one `timeout_s`. A resolver that hangs keeps its thread
until the C library gives up; lookups queued behind it time out here
meanwhile, so a hung resolver costs requests 503s, never a pile of threads.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from cronwheel.core.errors import ValidationError
from cronwheel.core.ssrf import Network, Resolver, check_webhook_url, webhook_host_port
from services.gateway.problems import Problem

FIELD = "target.url"
DEFAULT_TIMEOUT_S = 2.0
LOOKUP_THREADS = 8


def webhook_url(target: object) -> str | object | None:
    """The URL of a webhook target (NOT_A_URL when it holds no string there),
    or None for any other target."""
    if isinstance(target, dict) and target.get("type") == "webhook":
        url = target.get("url")
        return url if isinstance(url, str) else NOT_A_URL
    return None


NOT_A_URL = object()  # a webhook target whose url is missing or not a string


class LookupTimedOut(ValidationError):
    """A lookup past the timeout. A ValidationError so that a batch's store call
    keeps it in its job's slot (as it keeps a refusal); answered as `problem`,
    a 503 DNS_TIMEOUT naming the field, with Retry-After."""

    def __init__(self, timeout_s: float, field: str = FIELD):
        ms = round(timeout_s * 1000)
        detail = f"looking up the host of {field} took longer than {ms} ms; retry"
        super().__init__(field, detail, code="DNS_TIMEOUT")
        self.problem = Problem(503, "DNS_TIMEOUT", detail, field, headers={"Retry-After": "1"})


@dataclass(frozen=True)
class Verdicts:
    """What the lookups found, per URL: None (callable), the ValidationError
    that refuses it, or LookupTimedOut."""

    by_url: dict[object, Exception | None]

    def check(self, url: object) -> None:
        """Raise the verdict of `url` (a URL not looked up is checked now)."""
        if url is not None and (verdict := self.by_url.get(url)) is not None:
            raise verdict

    def raise_timeout(self) -> None:
        """The first timeout among them, as its 503 (before the transaction)."""
        for verdict in self.by_url.values():
            if isinstance(verdict, LookupTimedOut):
                raise verdict.problem


NONE = Verdicts({})


class DestinationCheck:
    """Looks webhook URLs up within `timeout_s` and vets their addresses."""

    def __init__(
        self,
        allow: Sequence[Network] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        resolve: Resolver = socket.getaddrinfo,
        threads: int = LOOKUP_THREADS,
    ):
        self.allow = list(allow)
        self.timeout_s = timeout_s
        self.resolve = resolve
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="gateway-dns")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def verdicts(self, urls: Iterable[object | None]) -> Verdicts:
        """The verdict of each URL among `urls` (as `webhook_url` gives them;
        None: not a webhook)."""
        wanted: dict[object, tuple[str, int] | ValidationError] = {}
        for url in urls:
            if url is None or url in wanted:
                continue
            try:
                wanted[url] = webhook_host_port(None if url is NOT_A_URL else url, FIELD)
            except ValidationError as e:
                wanted[url] = e
        if not wanted:
            return NONE
        lookups: dict[tuple[str, int], Future] = {}
        for where in wanted.values():
            if isinstance(where, tuple) and where not in lookups:
                lookups[where] = self._look_up(*where)
        if lookups:
            _done, late = wait(lookups.values(), timeout=self.timeout_s)
            for fut in late:
                fut.cancel()  # not started yet: never started; else its thread finishes alone
        out: dict[object, Exception | None] = {}
        for key, where in wanted.items():
            if isinstance(where, ValidationError):
                out[key] = where
                continue
            fut = lookups[where]
            if not fut.done() or fut.cancelled():
                out[key] = LookupTimedOut(self.timeout_s)
                continue
            try:
                check_webhook_url(key, field=FIELD, allow=self.allow, resolve=_answered(fut))
                out[key] = None
            except ValidationError as e:
                out[key] = e
        return Verdicts(out)

    def _look_up(self, host: str, port: int) -> Future:
        if _is_address(host):  # no lookup to wait for: answered here
            fut: Future = Future()
            try:
                fut.set_result(self.resolve(host, port, type=socket.SOCK_STREAM))
            except Exception as e:  # vetted like a lookup's error
                fut.set_exception(e)
            return fut
        return self._pool.submit(self.resolve, host, port, type=socket.SOCK_STREAM)


def _answered(fut: Future) -> Resolver:
    """A resolver that gives the lookup's answer, or raises its error."""
    return lambda *_a, **_k: fut.result()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
