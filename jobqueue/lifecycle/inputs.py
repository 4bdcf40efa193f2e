"""The lifecycle's inputs: typed values, and one validator per rule.

The edge parses: the HTTP API's serializers and URLs, the admin's forms and the commands'
arguments turn what they receive into UUIDs, ints, strings and the small frozen values
below, and refuse what is malformed (not JSON, not a UUID, not text). The lifecycle never
parses again; on entry it checks the domain's rules on those typed values with the
validators here: bounds that come from settings, which statuses a call may set, one item
per job in a batch. Each refuses with InvalidInput naming its field, before anything is
written (the HTTP edge answers 400 {"code": "validation_error", "detail", "fields"}).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from jobqueue import states
from jobqueue.conf import jobqueue_settings
from jobqueue.exceptions import InvalidInput

BATCH_REPORT_STATUSES = frozenset(states.REPORTABLE & states.TERMINAL)
MAX_DELAY_SECONDS = 10**8


class ClaimRef(NamedTuple):
    """One claim of a batch heartbeat (a plain (job_id, claim_id) tuple does as well)."""

    job_id: uuid.UUID
    claim_id: uuid.UUID


@dataclass(frozen=True)
class ReportItem:
    """One report of a batch report. None means "not given" (the job keeps its value)."""

    job_id: uuid.UUID
    claim_id: uuid.UUID
    status: str
    message: str | None = None
    result: object = None
    external_id: str | None = None
    retry: bool = False  # a retryable failure: queued again while attempts remain


# --- parsing (for the edge) -------------------------------------------------------------


def parse_uuid(value) -> uuid.UUID | None:
    """The UUID that `value` (a UUID or its text) names, or None when it names none."""
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


# --- rules --------------------------------------------------------------------------------


def bounded_int(value, field: str, low: int, high: int) -> int:
    """An int (not a bool) from `low` to `high`: the rule of every count and duration."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidInput(f"{field} must be an integer from {low} to {high}.", field=field)
    return value


def lease_seconds(value: int | None) -> int | None:
    """A job agent's lease (None: the service default)."""
    if value is None:
        return None
    conf = jobqueue_settings()
    return bounded_int(value, "lease_seconds", conf["MIN_LEASE_SECONDS"],
                       conf["MAX_LEASE_SECONDS"])


def max_attempts(value: int | None) -> int | None:
    """A job agent's or a job's attempts (None: the default)."""
    if value is None:
        return None
    conf = jobqueue_settings()
    return bounded_int(value, "max_attempts", conf["MIN_MAX_ATTEMPTS"], conf["MAX_MAX_ATTEMPTS"])


def claim_limit(value: int) -> int:
    """How many jobs one batch claim may take."""
    return bounded_int(value, "limit", 1, jobqueue_settings()["MAX_CLAIM_BATCH"])


def retry_after_seconds(value: int | None) -> int | None:
    """How long a released job stays unclaimable (None: not at all)."""
    if value is None:
        return None
    return bounded_int(value, "retry_after_seconds", 0,
                       jobqueue_settings()["MAX_RETRY_AFTER_SECONDS"])


def wait_seconds(value: int | None) -> int:
    """How long a claim or a producer's read may be held (0 or None: not at all)."""
    if value is None:
        return 0
    return bounded_int(value, "wait_seconds", 0, jobqueue_settings()["MAX_CLAIM_WAIT_SECONDS"])


def retry_backoff_seconds(value: int | None) -> int | None:
    """A job's first retry wait (None: JOBQUEUE_RETRY_BACKOFF_SECONDS)."""
    if value is None:
        return None
    return bounded_int(value, "retry_backoff_seconds", 0,
                       jobqueue_settings()["MAX_RETRY_BACKOFF_SECONDS"])


def max_runtime_seconds(value: int | None) -> int | None:
    """A job's (or its agent's default) runtime limit per attempt (None: no limit)."""
    if value is None:
        return None
    conf = jobqueue_settings()
    return bounded_int(value, "max_runtime_seconds", conf["MIN_MAX_RUNTIME_SECONDS"],
                       conf["MAX_MAX_RUNTIME_SECONDS"])


def expires_at(value: dt.datetime | None) -> dt.datetime | None:
    """When a job must be finished (None: never): a time with a time zone."""
    if value is not None and (not isinstance(value, dt.datetime) or value.tzinfo is None):
        raise InvalidInput("expires_at must be a time with a time zone.", field="expires_at")
    return value


def expires_at_ahead(value: dt.datetime | None,
                     now: Callable[[], dt.datetime]) -> dt.datetime | None:
    """A new job's expires_at: after the database's `now()`, at most MAX_EXPIRES_IN_SECONDS
    ahead (a replay of an idempotent create is not checked again)."""
    if value is None:
        return None
    horizon = jobqueue_settings()["MAX_EXPIRES_IN_SECONDS"]
    current = now()
    if not current < value <= current + dt.timedelta(seconds=horizon):
        raise InvalidInput(f"expires_at must be in the future, at most {horizon} seconds ahead.",
                           field="expires_at")
    return value


def report_retry(status: str, retry: bool) -> bool:
    """`retry` qualifies a failure only."""
    if retry and status != states.FAILURE:
        raise InvalidInput("retry may be true only with status failure.", field="retry")
    return retry


def delay_seconds(value: int | None) -> int | None:
    """How long a new job waits before it is claimable (None: not at all)."""
    if value is None:
        return None
    return bounded_int(value, "delay_seconds", 0, MAX_DELAY_SECONDS)


def idempotency_key(value: str | None) -> str | None:
    """A producer's Idempotency-Key: 1 to 255 printable characters (None: none)."""
    if value is not None and (not value or len(value) > 255 or not value.isprintable()):
        raise InvalidInput(
            "Idempotency-Key must be 1 to 255 printable characters.", field="idempotency_key"
        )
    return value


MAX_UNIQUE_KEY_LENGTH = 255
MAX_DEBOUNCE_SECONDS = 86_400
MAX_DEBOUNCE_MAX_SECONDS = 7 * 86_400
ON_CONFLICT = ("skip", "replace")
UNCLAIMED = frozenset({states.PENDING, states.QUEUED})  # live, and no claim holds it


@dataclass(frozen=True)
class Uniqueness:
    """How a create with a unique_key meets the live jobs with its key (docs/api.md, "Unique
    jobs and debounce"): which statuses count as live (`live`), whether it replaces an
    unclaimed one, and its debounce (None: none; `debounce_max_seconds` None: no cap)."""

    key: str
    live: frozenset[str] = states.ACTIVE
    replace: bool = False
    debounce_seconds: int | None = None
    debounce_max_seconds: int | None = None


def uniqueness(key: str | None, unique_states=None, on_conflict: str | None = None,
               debounce_seconds: int | None = None,
               debounce_max_seconds: int | None = None) -> Uniqueness | None:
    """A create's unique key and its options, or None (no key, and then no option)."""
    if key is None:
        for field, value in (("unique_states", unique_states), ("on_conflict", on_conflict),
                             ("debounce_seconds", debounce_seconds),
                             ("debounce_max_seconds", debounce_max_seconds)):
            if value is not None:
                raise InvalidInput(f"{field} applies only with a unique_key.", field=field)
        return None
    if (not isinstance(key, str) or not 1 <= len(key) <= MAX_UNIQUE_KEY_LENGTH
            or not key.isprintable()):
        raise InvalidInput(f"unique_key must be 1 to {MAX_UNIQUE_KEY_LENGTH} printable "
                           "characters.", field="unique_key")
    live = states.ACTIVE
    if unique_states is not None:
        allowed = ", ".join(sorted(states.ACTIVE))
        if (not isinstance(unique_states, (list, tuple, set, frozenset)) or not unique_states
                or not set(unique_states) <= states.ACTIVE):
            raise InvalidInput(f"unique_states must be a non-empty list of: {allowed}.",
                               field="unique_states")
        live = frozenset(unique_states)
    if on_conflict is not None and on_conflict not in ON_CONFLICT:
        raise InvalidInput("on_conflict must be one of: " + ", ".join(ON_CONFLICT) + ".",
                           field="on_conflict")
    if debounce_seconds is not None:
        bounded_int(debounce_seconds, "debounce_seconds", 1, MAX_DEBOUNCE_SECONDS)
        if states.QUEUED not in live:
            raise InvalidInput("debounce_seconds needs queued among the unique_states (it "
                               "acts on a queued job).", field="debounce_seconds")
    if debounce_max_seconds is not None:
        if debounce_seconds is None:
            raise InvalidInput("debounce_max_seconds applies only with debounce_seconds.",
                               field="debounce_max_seconds")
        bounded_int(debounce_max_seconds, "debounce_max_seconds", debounce_seconds,
                    MAX_DEBOUNCE_MAX_SECONDS)
    return Uniqueness(key, live, on_conflict == "replace", debounce_seconds,
                      debounce_max_seconds)


MAX_CONCURRENCY_KEY_LENGTH = 255
MAX_CONCURRENCY_LIMIT = 1000
MAX_RATE_LIMIT_KEY_LENGTH = 255
MAX_RATE_LIMIT_COUNT = 100_000
MAX_RATE_LIMIT_PERIOD_SECONDS = 86_400
DEFAULT_CONCURRENCY_LIMIT = 1


def concurrency(key: str | None, limit: int | None = None) -> tuple[str | None, int | None]:
    """A job's concurrency key and limit (docs/api.md, "Concurrency keys"): (None, None) for
    a plain job; else the key, 1 to 255 printable characters, and the limit, an integer from
    1 to 1000 (default 1). A limit needs a key."""
    if key is None:
        if limit is not None:
            raise InvalidInput("concurrency_limit applies only with a concurrency_key.",
                               field="concurrency_limit")
        return None, None
    if (not isinstance(key, str) or not 1 <= len(key) <= MAX_CONCURRENCY_KEY_LENGTH
            or not key.isprintable()):
        raise InvalidInput(f"concurrency_key must be 1 to {MAX_CONCURRENCY_KEY_LENGTH} "
                           "printable characters.", field="concurrency_key")
    if limit is None:
        return key, DEFAULT_CONCURRENCY_LIMIT
    return key, bounded_int(limit, "concurrency_limit", 1, MAX_CONCURRENCY_LIMIT)


MAX_DEPENDENCIES = 100


def depends_on(value, field: str = "depends_on") -> tuple[uuid.UUID, ...] | None:
    """A create's parents: None (no dependencies), or 1 to MAX_DEPENDENCIES job ids, each
    counted once (a repeated id is the same dependency), in the order first sent."""
    if value is None:
        return None
    ids = [parse_uuid(v) for v in value]
    if None in ids:
        raise InvalidInput("Each dependency is a job id.", field=field)
    if not 1 <= len(ids) <= MAX_DEPENDENCIES:
        raise InvalidInput(f"From 1 to {MAX_DEPENDENCIES} dependencies.", field=field)
    return tuple(dict.fromkeys(ids))


MAX_GROUP_LENGTH = 200
MAX_HOLDER_LENGTH = 200
INT32_MAX = 2**31 - 1


def holder(value: str | None) -> str:
    """The agent process that claims (e.g. "host:pid"): up to 200 printable characters
    ("" or None: not named)."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_HOLDER_LENGTH or not value.isprintable():
        raise InvalidInput(f"Must be up to {MAX_HOLDER_LENGTH} printable characters.",
                           field="holder")
    return value


def checkpoint(value) -> str | None:
    """A checkpoint (any JSON value but null: None means "not given"), as its JSON text, of
    at most MAX_CHECKPOINT_BYTES."""
    if value is None:
        return None
    limit = jobqueue_settings()["MAX_CHECKPOINT_BYTES"]
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput("Must be JSON.", field="checkpoint") from exc
    if len(text.encode()) > limit:
        raise InvalidInput(f"Must be at most {limit} bytes of JSON.",
                           field="checkpoint")
    return text


def expected_attempt(value: int | None) -> int | None:
    """The attempt a named claim expects the job to be at (None: any)."""
    if value is None:
        return None
    return bounded_int(value, "expected_attempt", 0, INT32_MAX)


def group_name(value: str | None) -> str | None:
    """A job's group: 1 to 200 printable characters without "/", and not "." or ".." (it is
    a path segment of groups/{group}, and URL clients remove dot segments); None: no group."""
    if value is not None and (
        not isinstance(value, str) or not 1 <= len(value) <= MAX_GROUP_LENGTH
        or not value.isprintable() or "/" in value or value in (".", "..")
    ):
        raise InvalidInput(
            f'Must be 1 to {MAX_GROUP_LENGTH} printable characters without "/", and not "." '
            'or "..".',
            field="group",
        )
    return value


LABEL = re.compile(r"[A-Za-z0-9._:=/-]{1,63}")
MAX_AGENT_LABELS = 32


def labels(value, field: str = "labels", most: int = MAX_AGENT_LABELS) -> list[str]:
    """A label set (docs/api.md, "Labels"): a list of at most `most` strings, each 1 to 63
    characters of [A-Za-z0-9._:=/-], case-sensitive. A set: repeats are dropped and it is kept
    sorted, so two equal sets are equal lists."""
    if not isinstance(value, list | tuple) or len(value) > most:
        raise InvalidInput(f"{field} must be a list of at most {most} labels.", field=field)
    for label in value:
        if not isinstance(label, str) or not LABEL.fullmatch(label):
            raise InvalidInput(f"each of {field} must be 1 to 63 characters of "
                               "A-Z a-z 0-9 . _ : = / -.", field=field)
    return sorted(set(value))


MAX_JOB_LABELS = 16


def job_labels(value) -> list[str]:
    """A labelled job's target: 1 to 16 labels (`labels`' rule otherwise)."""
    found = labels(value, "labels", MAX_JOB_LABELS)
    if not found:
        raise InvalidInput("labels must hold 1 to 16 labels.", field="labels")
    return found


def agent_name(value: str) -> str:
    name = (value or "").strip()
    if not name:
        raise InvalidInput("name must not be empty.", field="name")
    return name


def reportable_status(status: str) -> str:
    """What an agent may report: progress (in_progress) or a terminal status it sets."""
    if status not in states.REPORTABLE:
        raise InvalidInput(
            "status must be one of: " + ", ".join(sorted(states.REPORTABLE)) + ".", field="status"
        )
    return status


def report_content(message: str | None, result) -> None:
    """A report's message and result within JOBQUEUE_MAX_MESSAGE_BYTES (UTF-8) and
    JOBQUEUE_MAX_RESULT_BYTES (the result's compact JSON), None being "not given"."""
    conf = jobqueue_settings()
    limit = conf["MAX_MESSAGE_BYTES"]
    if message is not None and len(message.encode("utf-8", "surrogatepass")) > limit:
        # The detail names the setting, not the field: an error never repeats a string the
        # client sent, its keys included (the edge replaces a detail that would).
        raise InvalidInput(
            f"Too long: at most {limit} bytes of UTF-8 (JOBQUEUE_MAX_MESSAGE_BYTES).",
            field="message",
        )
    limit = conf["MAX_RESULT_BYTES"]
    if result is not None and json_size(result) > limit:
        raise InvalidInput(
            f"Too large: at most {limit} bytes as compact JSON (JOBQUEUE_MAX_RESULT_BYTES).",
            field="result",
        )


def json_size(value) -> int:
    """The size in bytes of `value` as compact UTF-8 JSON."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return len(text.encode("utf-8", "surrogatepass"))


def heartbeat_batch(claims: Sequence[ClaimRef]) -> Sequence[ClaimRef]:
    """1 to MAX_HEARTBEAT_BATCH claims, each job once."""
    return _batch(claims, "claims", jobqueue_settings()["MAX_HEARTBEAT_BATCH"], lambda c: c[0])


def report_batch(reports: Sequence[ReportItem]) -> Sequence[ReportItem]:
    """1 to MAX_REPORT_BATCH reports, each job once, each with a status that ends the job
    and a message and result within their caps (report_content)."""
    allowed = ", ".join(sorted(BATCH_REPORT_STATUSES))

    def job_of(report: ReportItem):
        if report.status not in BATCH_REPORT_STATUSES:
            raise InvalidInput(f"status must be one of: {allowed}.", field="status")
        report_retry(report.status, report.retry)
        report_content(report.message, report.result)
        return report.job_id

    return _batch(reports, "reports", jobqueue_settings()["MAX_REPORT_BATCH"], job_of)


def _batch(items: Sequence, field: str, limit: int, job_of: Callable) -> Sequence:
    if not isinstance(items, (list, tuple)) or not 1 <= len(items) <= limit:
        raise InvalidInput(f"{field} must be a list of 1 to {limit} items.", field=field)
    seen = set()
    for item in items:
        job_id = job_of(item)
        if job_id in seen:
            raise InvalidInput(f"each job_id may appear only once in {field}.", field=field)
        seen.add(job_id)
    return items


def key_text(key, field: str, max_length: int = MAX_RATE_LIMIT_KEY_LENGTH) -> str:
    """A flow-control key (a rate limit's, a fairness key): 1 to 255 printable characters."""
    if not isinstance(key, str) or not 1 <= len(key) <= max_length or not key.isprintable():
        raise InvalidInput(f"{field} must be 1 to {max_length} printable characters.",
                           field=field)
    return key


def rate_limit_key(key) -> str | None:
    """A job's rate limit key (docs/api.md, "Rate limits"): None for a plain job; else 1 to
    255 printable characters."""
    return None if key is None else key_text(key, "rate_limit_key")


def rate_limit(count, period_seconds) -> tuple[int, int]:
    """A rate limit (PUT rate-limits/{key}): count 1 to 100,000 claims in period_seconds 1 to
    86,400, both required integers."""
    if count is None:
        raise InvalidInput("count is required.", field="count")
    if period_seconds is None:
        raise InvalidInput("period_seconds is required.", field="period_seconds")
    return (bounded_int(count, "count", 1, MAX_RATE_LIMIT_COUNT),
            bounded_int(period_seconds, "period_seconds", 1, MAX_RATE_LIMIT_PERIOD_SECONDS))


MAX_FAIRNESS_WEIGHT = 100


def fairness_key(key) -> str | None:
    """A job's fairness key (docs/api.md, "Fair shares"): None for a plain job; else 1 to 255
    printable characters."""
    return None if key is None else key_text(key, "fairness_key")


def fairness_weight(weight) -> int:
    """A fairness key's weight (PUT fairness-keys/{key}): a required integer, 1 to 100."""
    if weight is None:
        raise InvalidInput("weight is required.", field="weight")
    return bounded_int(weight, "weight", 1, MAX_FAIRNESS_WEIGHT)
