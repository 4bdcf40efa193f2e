"""The webhook sender: sends the outbox (webhook_delivery rows written with each terminal
transition), signs every request, retries with exponential backoff and jitter, and gives up
after WEBHOOK_MAX_ATTEMPTS tries (the delivery is then `failed`; the admin can redeliver it).

At least once: a sender takes due deliveries with FOR UPDATE SKIP LOCKED (SQLite: inside one
BEGIN IMMEDIATE) and reserves each for WEBHOOK_LEASE_SECONDS (pushes its next_attempt_at and
counts the try) before it sends, outside any transaction; so concurrent senders never send
one try twice at once, and a sender that dies mid-send leaves the delivery to be sent again
when the reservation ends. The result is written only if the delivery is still this sender's
try (attempts unchanged). Ordering per endpoint is not promised.

Outbound safety: http(s) only, redirects never followed, at most WEBHOOK_RESPONSE_BYTES of
an answer read, WEBHOOK_TIMEOUT_SECONDS per request, and targets restricted to
WEBHOOK_ALLOWED_NETWORKS when it is set (every address the host resolves to must be inside).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import random
import secrets
import socket
import time
from urllib.parse import urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.models import Job, WebhookAttempt, WebhookDelivery, WebhookEndpoint

from . import records

SERVICE = "webhooks"
USER_AGENT = "jobqueue-webhooks/1"
log = logging.getLogger("jobqueue.webhooks")

JOB_FIELDS = ("id", "workspace_id", "job_agent_id", "status", "job_agent_config", "result",
              "message", "external_id", "attempt", "max_attempts", "priority", "available_at",
              "created_at", "started_at", "completed_at", "updated_at", "idempotency_key")


class TargetRefused(Exception):
    """The URL may not be called (scheme, or an address outside the allowed networks)."""


def interval_seconds() -> float:
    return float(jobqueue_settings()["WEBHOOK_INTERVAL_SECONDS"])


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The X-Jobqueue-Signature value: t=<unix seconds>,v1=<hex HMAC-SHA256 of "t.body">."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def job_document(job: Job) -> dict:
    """The job as the API shows it (GET jobs/{id}), without dispatch_context."""
    doc = {}
    for name in JOB_FIELDS:
        value = getattr(job, name)
        if hasattr(value, "isoformat"):
            value = value.isoformat().replace("+00:00", "Z")
        elif name.endswith("id") and value is not None and name != "external_id":
            value = str(value)
        doc[name] = value
    return doc


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
    WEBHOOK_LEASE_SECONDS ahead, so nobody else sends it meanwhile."""
    lease = jobqueue_settings()["WEBHOOK_LEASE_SECONDS"]
    with transaction.atomic():
        ids = list(WebhookDelivery.objects.due().order_by("next_attempt_at")
                   .select_for_update(skip_locked=True).values_list("id", flat=True)[:limit])
        if not ids:
            return []
        WebhookDelivery.objects.due().filter(id__in=ids).update(
            attempts=F("attempts") + 1, next_attempt_at=NowPlusSeconds(lease),
            last_attempt_at=Now())
        taken = list(WebhookDelivery.objects.filter(id__in=ids).select_related("endpoint"))
        for delivery in taken:
            if delivery.payload is None:  # a job's: its body is fixed at the first try
                # (a group.finished delivery's body was fixed when it was written)
                job = Job.objects.get(id=delivery.job_id)
                delivery.payload = {
                    "id": str(delivery.id),
                    "event": delivery.event,
                    "created_at": delivery.created_at.isoformat().replace("+00:00", "Z"),
                    "job": job_document(job),
                }
                WebhookDelivery.objects.filter(id=delivery.id).update(payload=delivery.payload)
    return taken


def deliver(client: httpx.Client, delivery: WebhookDelivery, timestamp: int
            ) -> tuple[int | None, str]:
    """POST one delivery: (status code or None, error or "")."""
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Jobqueue-Event": delivery.event,
        "X-Jobqueue-Delivery": str(delivery.id),
        "X-Jobqueue-Signature": sign(delivery.endpoint.secret, timestamp, body),
    }
    cap = jobqueue_settings()["WEBHOOK_RESPONSE_BYTES"]
    try:
        check_target(delivery.endpoint.url)
        with client.stream("POST", delivery.endpoint.url, content=body, headers=headers) as r:
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
        return None, f"{type(exc).__name__}: {exc}"[:500]
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


def client() -> httpx.Client:
    timeout = jobqueue_settings()["WEBHOOK_TIMEOUT_SECONDS"]
    return httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False)


def run_once(*, limit: int | None = None) -> dict:
    """Send every due delivery (up to `limit`); counts of what became of them."""
    limit = limit or jobqueue_settings()["WEBHOOK_BATCH_SIZE"]
    counts = {"delivered": 0, "retrying": 0, "failed": 0, "stale": 0}
    taken = take(limit)
    if not taken:
        return counts
    timestamp = int(db_now().timestamp())
    with client() as http:
        for delivery in taken:
            started = time.monotonic()
            code, error = deliver(http, delivery, timestamp)
            outcome = finish(delivery, code, error, time.monotonic() - started)
            counts[outcome] += 1
            if error:
                log.info("webhook %s try %d: %s", delivery.id, delivery.attempts, error)
    return counts


def service_run(*, idle_run_id: int | None = None) -> tuple[dict, int | None, bool]:
    """run_once as the maintenance loop calls it, recorded in maintenance_run."""
    started = time.monotonic()
    counts = run_once()
    idle = not any(counts.values())
    run_id = records.record(SERVICE, counts, time.monotonic() - started, idle=idle,
                            idle_run_id=idle_run_id)
    return counts, run_id, idle


def redeliver(ids) -> int:
    """Send these deliveries again, now, with every try again (the admin's action)."""
    return WebhookDelivery.objects.filter(id__in=list(ids)).update(
        status=WebhookDelivery.PENDING, attempts=0, next_attempt_at=Now())


def create_endpoint(workspace_id, url: str, events=None) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its signing secret (the caller shows it once; nothing shows it
    again). `url` and `events` are checked by the caller (the API's serializer)."""
    secret = "whsec_" + secrets.token_urlsafe(32)
    endpoint = WebhookEndpoint.objects.create(workspace_id=workspace_id, url=url,
                                              events=sorted(set(events or [])), secret=secret)
    endpoint.refresh_from_db(fields=["created_at"])
    return endpoint, secret
