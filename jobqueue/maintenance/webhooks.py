"""The webhook sender: sends the outbox (webhook_delivery rows written with each terminal
transition), signs every request, retries with exponential backoff and jitter, and gives up
after WEBHOOK_MAX_ATTEMPTS tries (the delivery is then `failed`; the admin can redeliver it).

At least once: a sender takes due deliveries with FOR UPDATE SKIP LOCKED (SQLite: inside one
BEGIN IMMEDIATE) and reserves each for WEBHOOK_LEASE_SECONDS (pushes its next_attempt_at and
counts the try) before it sends, outside any transaction; so concurrent senders never send
one try twice at once, and a sender that dies mid-send leaves the delivery to be sent again
when the reservation ends. The result is written only if the delivery is still this sender's
try (attempts unchanged). Ordering per endpoint is not promised.

Fair and bounded: a batch is shared round-robin between workspaces and their endpoints
(fair_share); worker threads send to several endpoints at once (WEBHOOK_CONCURRENCY), one
connection per endpoint at a time; WEBHOOK_TIMEOUT_SECONDS is the deadline of a whole try,
connect to the last byte read (Try), not of each read; a failed try puts the endpoint's other
deliveries of the batch back for the first retry's delay. The maintenance loop runs the sender
in its own thread (maintenance/loop.py), so a slow receiver never delays the reaper; a stop
cuts the tries in flight and puts them back.

Outbound safety: http(s) only, redirects never followed, at most WEBHOOK_RESPONSE_BYTES of
an answer read, and targets restricted to WEBHOOK_ALLOWED_NETWORKS when it is set (every
address the host resolves to must be inside).

The body of a delivery is fixed when its row is written, in the transaction of the transition
it tells of (lifecycle/finished.py); agent text in it is redacted when it is sent
(jobqueue.redaction), and each try is signed just before its POST.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import queue
import random
import secrets
import socket
import threading
import time
from collections import deque
from urllib.parse import urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import F, OuterRef, Subquery
from django.db.models.functions import Now

from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import WebhookLimitReached
from jobqueue.lifecycle.finished import finished_payload, json_time
from jobqueue.models import Job, WebhookAttempt, WebhookDelivery, WebhookEndpoint, Workspace
from jobqueue.redaction import redact_job_document, secret_strings

from . import run_records

SERVICE = "webhooks"
OWN_THREAD = True  # the maintenance loop runs the sender on its own thread
STOPPABLE = True  # service_run(stop=): a stop cuts the tries in flight
USER_AGENT = "jobqueue-webhooks/1"
log = logging.getLogger("jobqueue.webhooks")

class TargetRefused(Exception):
    """The URL may not be called (scheme, or an address outside the allowed networks)."""


def interval_seconds() -> float:
    return float(jobqueue_settings()["WEBHOOK_INTERVAL_SECONDS"])


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The X-Jobqueue-Signature value: t=<unix seconds>,v1=<hex HMAC-SHA256 of "t.body">."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def allowed_networks() -> list:
    raw = jobqueue_settings()["WEBHOOK_ALLOWED_NETWORKS"]
    try:
        return [ipaddress.ip_network(part.strip(), strict=False)
                for part in raw.split(",") if part.strip()]
    except ValueError as exc:
        raise ImproperlyConfigured("JOBQUEUE_WEBHOOK_ALLOWED_NETWORKS: comma-separated CIDRs"
                                   ) from exc


def check_target(url: str) -> None:
    """Refuse what the sender must not call (see the module's doc)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused("only http(s) URLs are called")
    networks = allowed_networks()
    if not networks:
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise TargetRefused(f"cannot resolve the host ({exc.strerror or exc})") from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not any(address in net for net in networks):
            raise TargetRefused("the target is outside JOBQUEUE_WEBHOOK_ALLOWED_NETWORKS")


def backoff_seconds(tries: int) -> float:
    """The pause after the `tries`-th failed try: BACKOFF * 2^(tries-1), at most MAX, +-20%."""
    conf = jobqueue_settings()
    base = min(conf["WEBHOOK_BACKOFF_SECONDS"] * 2 ** (tries - 1),
               conf["WEBHOOK_MAX_BACKOFF_SECONDS"])
    return base * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not a secret


def take(limit: int) -> list[WebhookDelivery]:
    """Reserve up to `limit` due deliveries for this sender: each try counted and pushed
    WEBHOOK_LEASE_SECONDS ahead, so nobody else sends it meanwhile. The batch is shared fairly
    (fair_share): one endpoint's backlog never holds back another endpoint's deliveries."""
    lease = jobqueue_settings()["WEBHOOK_LEASE_SECONDS"]
    with transaction.atomic():
        chosen = fair_share(limit)
        if not chosen:
            return []
        ids = list(WebhookDelivery.objects.due().filter(id__in=chosen)
                   .select_for_update(skip_locked=True).values_list("id", flat=True))
        if not ids:
            return []
        WebhookDelivery.objects.due().filter(id__in=ids).update(
            attempts=F("attempts") + 1, next_attempt_at=NowPlusSeconds(lease),
            last_attempt_at=Now())
        taken = list(WebhookDelivery.objects.filter(id__in=ids).select_related("endpoint"))
        for delivery in taken:
            if delivery.payload is None:  # written before bodies were fixed at the transition
                delivery.payload = finished_payload(Job.objects.get(id=delivery.job_id))
                WebhookDelivery.objects.filter(id=delivery.id).update(payload=delivery.payload)
    rank = {delivery_id: i for i, delivery_id in enumerate(chosen)}
    return sorted(taken, key=lambda d: rank[d.id])


def fair_share(limit: int) -> list:
    """The ids of up to `limit` due deliveries, dealt round-robin: between the workspaces that
    have due deliveries, and within a workspace between its endpoints, the endpoint whose
    oldest due delivery waited longest first (at most `limit` endpoints a batch). Each
    endpoint's own are oldest first. Reads only: take() locks what it gets."""
    due = WebhookDelivery.objects.due()
    oldest = Subquery(due.filter(endpoint_id=OuterRef("pk")).order_by("next_attempt_at")
                      .values("next_attempt_at")[:1])
    endpoints = (WebhookEndpoint.objects.annotate(oldest=oldest).filter(oldest__isnull=False)
                 .order_by("oldest", "id").values_list("id", "workspace_id")[:limit])
    workspaces: dict = {}  # workspace -> deque of its endpoints' deques of due ids
    for endpoint_id, workspace_id in endpoints:
        ids = deque(due.filter(endpoint_id=endpoint_id).order_by("next_attempt_at", "id")
                    .values_list("id", flat=True)[:limit])
        if ids:  # pragma: no branch -- race: another sender took them since
            workspaces.setdefault(workspace_id, deque()).append(ids)
    chosen = []
    while workspaces and len(chosen) < limit:
        for workspace_id in list(workspaces):
            queues = workspaces[workspace_id]
            ids = queues.popleft()
            chosen.append(ids.popleft())
            if ids:
                queues.append(ids)
            if not queues:
                del workspaces[workspace_id]
            if len(chosen) >= limit:
                break
    return chosen


class Try:
    """One try's deadline and connection. cut() shuts the connection down (a duplicate of its
    socket, taken when it connected: shutting down any descriptor of a socket ends it for all,
    TLS included), so a read, write or TLS handshake in progress fails at once; a connect
    still in progress is cut as soon as it completes (it is bounded by the timeout itself)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.cut_for = ""  # "timeout" or "stopped"
        self._lock = threading.Lock()
        self._sock = None
        self._done = False

    def trace(self, event: str, info: dict) -> None:
        """httpx's (httpcore's) trace extension: told of every step of the request."""
        if event != "connection.connect_tcp.complete":
            return
        sock = info["return_value"].get_extra_info("socket").dup()
        with self._lock:
            if self._done:  # pragma: no cover -- race: the try ended as it connected
                sock.close()
                return
            self._sock = sock
            cut = bool(self.cut_for)
        if cut:  # pragma: no cover -- race: cut as it connected
            _shutdown(sock)

    def cut(self, why: str) -> None:
        with self._lock:
            if self.cut_for or self._done:
                return  # pragma: no cover -- race: cut or ended already
            self.cut_for, sock = why, self._sock
        if sock is not None:  # pragma: no branch -- race: cut before it connected
            _shutdown(sock)

    def close(self) -> None:
        with self._lock:
            self._done, sock, self._sock = True, self._sock, None
        if sock is not None:
            sock.close()


def _shutdown(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # pragma: no cover -- race: closed by the peer or by httpx already
        pass


def body_of(delivery: WebhookDelivery, secrets: list[str]) -> bytes:
    """The bytes sent: the row's id, event and created_at and its fixed payload, agent text
    redacted (the same bytes on every try: none of them, nor the job's dispatch_context, ever
    changes)."""
    body = {"id": str(delivery.id), "event": delivery.event,
            "created_at": json_time(delivery.created_at), **delivery.payload}
    if "job" in body:
        body["job"] = redact_job_document(body["job"], secrets)
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def deliver(client: httpx.Client, delivery: WebhookDelivery, timestamp: int,
            secrets: list[str] = (), attempt: Try | None = None) -> tuple[int | None, str]:
    """POST one delivery, signed with `timestamp`: (status code or None, error or ""). With
    `attempt`, the whole request (connect to the last byte read) ends by its deadline."""
    body = body_of(delivery, list(secrets))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Jobqueue-Event": delivery.event,
        "X-Jobqueue-Delivery": str(delivery.id),
        "X-Jobqueue-Signature": sign(delivery.endpoint.secret, timestamp, body),
    }
    cap = jobqueue_settings()["WEBHOOK_RESPONSE_BYTES"]
    extensions = {"trace": attempt.trace} if attempt is not None else {}
    try:
        check_target(delivery.endpoint.url)
        with client.stream("POST", delivery.endpoint.url, content=body, headers=headers,
                           extensions=extensions) as r:
            read = 0
            for chunk in r.iter_raw():
                read += len(chunk)
                if read >= cap:
                    break
            code = r.status_code
    except TargetRefused as exc:
        return None, f"refused: {exc}"
    except httpx.TimeoutException:
        return None, "timeout"
    except httpx.HTTPError as exc:
        if attempt is not None and attempt.cut_for:
            return None, "timeout"
        return None, f"{type(exc).__name__}: {exc}"[:500]
    if attempt is not None and attempt.cut_for:
        # The answer's end came too late (a close-delimited body): timing decides.
        return None, "timeout"  # pragma: no cover -- timing (above)
    if 200 <= code < 300:
        return code, ""
    return code, "redirect not followed" if 300 <= code < 400 else f"answered {code}"


def finish(delivery: WebhookDelivery, code: int | None, error: str, duration: float) -> str:
    """Record the try; the delivery's outcome: delivered, retrying, failed (or stale)."""
    tries = delivery.attempts
    max_attempts = jobqueue_settings()["WEBHOOK_MAX_ATTEMPTS"]
    with transaction.atomic():
        WebhookAttempt.objects.create(delivery_id=delivery.id, number=tries,
                                      duration_seconds=duration, status_code=code, error=error)
        mine = WebhookDelivery.objects.filter(id=delivery.id, attempts=tries,
                                              status=WebhookDelivery.PENDING)
        common = {"last_status_code": code, "last_error": error}
        if not error:
            outcome, n = "delivered", mine.update(status=WebhookDelivery.DELIVERED,
                                                  next_attempt_at=Now(), **common)
        elif tries >= max_attempts:
            outcome, n = "failed", mine.update(status=WebhookDelivery.FAILED,
                                               next_attempt_at=Now(), **common)
        else:
            outcome, n = "retrying", mine.update(
                next_attempt_at=NowPlusSeconds(backoff_seconds(tries)), **common)
    return outcome if n else "stale"


def give_back(delivery: WebhookDelivery, delay: float = 0.0) -> bool:
    """Undo the reservation of a try that never ran (or that a stop cut short): not counted,
    due again after `delay` seconds; unless the delivery is no longer this sender's try."""
    return bool(WebhookDelivery.objects.filter(
        id=delivery.id, attempts=delivery.attempts, status=WebhookDelivery.PENDING,
    ).update(attempts=F("attempts") - 1, next_attempt_at=NowPlusSeconds(delay)))


def client() -> httpx.Client:
    # No keep-alive: every try opens its own connection, which its deadline can cut (Try).
    timeout = jobqueue_settings()["WEBHOOK_TIMEOUT_SECONDS"]
    return httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False,
                        limits=httpx.Limits(max_keepalive_connections=0))


POLL_SECONDS = 0.1  # how often the sender looks at its stop event while tries are in flight


class Batch:
    """One batch being sent. Worker threads (WEBHOOK_CONCURRENCY, pure HTTP: no database)
    send each endpoint's deliveries one after another (one connection per endpoint at a time);
    the sender's thread records every result, cuts every try at its deadline (and all of them
    when told to stop), and puts back what was not tried:

    - after a failed try, the endpoint's other deliveries of the batch wait for the first
      retry's delay (a slow or broken receiver costs one try a batch, not one per delivery);
    - no try starts later than the timeout after the batch began: a batch lasts at most about
      twice the timeout (so keep WEBHOOK_LEASE_SECONDS above that: every try then ends within
      its reservation); what did not start is put back, due at once.
    """

    def __init__(self, taken: list[WebhookDelivery], stop: threading.Event | None):
        conf = jobqueue_settings()
        self.timeout = float(conf["WEBHOOK_TIMEOUT_SECONDS"])
        self.concurrency = max(1, int(conf["WEBHOOK_CONCURRENCY"]))
        self.began = time.monotonic()
        self.start_by = self.began + self.timeout
        # Signatures carry the database's clock: read once, advanced by this host's.
        self.clock = db_now().timestamp() - self.began
        self.stop = stop or threading.Event()
        self.taken = taken
        contexts = dict(Job.objects.filter(id__in={d.job_id for d in taken if d.job_id})
                        .values_list("id", "dispatch_context"))
        self.secrets = {job_id: secret_strings(ctx) for job_id, ctx in contexts.items()}
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.inflight: set[Try] = set()

    def run(self) -> dict:
        counts = {"delivered": 0, "retrying": 0, "failed": 0, "stale": 0, "deferred": 0}
        by_endpoint: dict = {}
        for delivery in self.taken:  # in take()'s fair order
            by_endpoint.setdefault(delivery.endpoint_id, []).append(delivery)
        for deliveries in by_endpoint.values():
            self.tasks.put(deliveries)
        left = {d.id: d for d in self.taken}
        with client() as http:
            for _ in range(min(self.concurrency, len(by_endpoint))):
                threading.Thread(target=self._work, args=(http,), daemon=True,
                                 name="webhook-sender").start()
            while left and not self.stop.is_set():
                try:
                    item = self.results.get(timeout=self._wait())
                except queue.Empty:
                    item = None
                if item is not None:
                    self._record(item, counts)
                    left.pop(item[0].id)
                self._cut_late_tries()
            if left:  # stopped: cut what is in flight, record what has ended, give back the rest
                self._cut_all("stopped")
                while True:
                    try:
                        item = self.results.get_nowait()
                    except queue.Empty:
                        break
                    if item[0].id in left:  # pragma: no cover -- race: ended as the stop came
                        self._record(item, counts)
                        left.pop(item[0].id)
                for delivery in left.values():
                    counts["deferred"] += give_back(delivery)
        return counts

    def _wait(self) -> float:
        now = time.monotonic()
        with self.lock:  # a try already cut ends by itself: no deadline to wait for
            deadlines = [t.deadline for t in self.inflight if not t.cut_for]
        return max(0.0, min([POLL_SECONDS, *(d - now for d in deadlines)]))

    def _cut_late_tries(self) -> None:
        now = time.monotonic()
        with self.lock:
            late = [t for t in self.inflight if t.deadline <= now and not t.cut_for]
        for t in late:
            t.cut("timeout")

    def _cut_all(self, why: str) -> None:
        with self.lock:
            tries = list(self.inflight)
        for t in tries:
            t.cut(why)

    def _record(self, item, counts: dict) -> None:
        delivery, outcome = item[0], item[1]
        if outcome == "sent":
            code, error, duration, cut_for = item[2]
            if cut_for == "stopped":  # pragma: no cover -- race: ended as the stop came
                counts["deferred"] += give_back(delivery)
                return
            counts[finish(delivery, code, error, duration)] += 1
            if error:
                log.info("webhook %s try %d: %s", delivery.id, delivery.attempts, error)
        else:  # untried: after a failed try of its endpoint (rest), or too late to start
            rest = item[2] and not self.stop.is_set()
            counts["deferred"] += give_back(delivery, backoff_seconds(1) if rest else 0.0)

    def _work(self, http: httpx.Client) -> None:
        while not self.stop.is_set():
            try:
                deliveries = self.tasks.get_nowait()
            except queue.Empty:
                return
            failed = False
            for delivery in deliveries:
                if failed or self.stop.is_set() or time.monotonic() > self.start_by:
                    self.results.put((delivery, "untried", failed))
                    continue
                result = self._try(http, delivery)
                self.results.put((delivery, "sent", result))
                failed = bool(result[1]) and result[3] != "stopped"

    def _try(self, http: httpx.Client, delivery: WebhookDelivery) -> tuple:
        started = time.monotonic()
        attempt = Try(started + self.timeout)
        with self.lock:
            self.inflight.add(attempt)
        try:
            code, error = deliver(http, delivery, int(self.clock + time.monotonic()),
                                  self.secrets.get(delivery.job_id, ()), attempt)
        # Every try must have a result (a guard: deliver() turns what httpx raises into one).
        except Exception as exc:  # noqa: BLE001  # pragma: no cover -- a guard (above)
            code, error = None, f"{type(exc).__name__}: {exc}"[:500]
        finally:
            with self.lock:
                self.inflight.discard(attempt)
            attempt.close()
        return code, error, time.monotonic() - started, attempt.cut_for


def run_once(*, limit: int | None = None, stop: threading.Event | None = None) -> dict:
    """Send due deliveries (up to `limit`, WEBHOOK_BATCH_SIZE by default): counts of what
    became of them (`deferred`: put back untried). Setting `stop` cuts the tries in flight
    and ends the batch at once; what it did not finish is put back, due at once."""
    limit = limit or jobqueue_settings()["WEBHOOK_BATCH_SIZE"]
    taken = take(limit)
    if not taken:
        return {"delivered": 0, "retrying": 0, "failed": 0, "stale": 0, "deferred": 0}
    return Batch(taken, stop).run()


def service_run(*, idle_run_id: int | None = None, stop: threading.Event | None = None
                ) -> tuple[dict, int | None, bool]:
    """run_once as the maintenance loop calls it, recorded in maintenance_run."""
    started = time.monotonic()
    counts = run_once(stop=stop)
    idle = not any(counts.values())
    run_id = run_records.record(SERVICE, counts, time.monotonic() - started, idle=idle,
                            idle_run_id=idle_run_id)
    return counts, run_id, idle


def redeliver(ids) -> int:
    """Send these deliveries again, now, with every try again (the admin's action)."""
    return WebhookDelivery.objects.filter(id__in=list(ids)).update(
        status=WebhookDelivery.PENDING, attempts=0, next_attempt_at=Now())


def create_endpoint(workspace_id, url: str, events=None) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its signing secret (the caller shows it once; nothing shows it
    again). `url` and `events` are checked by the caller (the API's serializer). At most
    MAX_WEBHOOKS_PER_WORKSPACE endpoints a workspace (WebhookLimitReached): racing creates
    are serialized on the workspace's row, so none gets past the cap."""
    cap = jobqueue_settings()["MAX_WEBHOOKS_PER_WORKSPACE"]
    secret = "whsec_" + secrets.token_urlsafe(32)
    with transaction.atomic():
        Workspace.objects.select_for_update().filter(id=workspace_id).values_list("id").first()
        if WebhookEndpoint.objects.filter(workspace_id=workspace_id).count() >= cap:
            raise WebhookLimitReached(
                f"The workspace has {cap} webhook endpoints, the most it may have "
                "(JOBQUEUE_MAX_WEBHOOKS_PER_WORKSPACE); delete one first.")
        endpoint = WebhookEndpoint.objects.create(workspace_id=workspace_id, url=url,
                                                  events=sorted(set(events or [])),
                                                  secret=secret)
    endpoint.refresh_from_db(fields=["created_at"])
    return endpoint, secret
