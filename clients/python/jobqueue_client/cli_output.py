"""What `jobqueue` (producer_cli.py) prints: machine output (`--json`: one JSON document on
stdout; errors as one JSON object on stderr) or text for people, and the message of every
error, which says what to change.

Nothing here talks to the server: it formats what the ProducerClient returned or raised.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Iterable
from typing import Any

from .errors import (
    ApiError,
    AuthError,
    Conflict,
    InvalidRequest,
    NotFound,
    Throttled,
    TransportError,
)
from .producer import LogChunk

# Exit statuses (docs/cli.md, "Exit status"): every command ends with one of these.
EXIT_OK = 0
EXIT_NOT_SUCCESSFUL = 1  # the job waited for ended, but not `successful`
EXIT_USAGE = 2  # a bad option or argument, missing settings, or a field the server refused
EXIT_NOT_FOUND = 3  # no such job, group or artifact in the workspace (404)
EXIT_AUTH = 4  # the API key was refused (401) or may not do that (403)
EXIT_UNAVAILABLE = 5  # no answer, a server error (5xx), throttled (429), a bad answer
EXIT_CONFLICT = 6  # the job's or group's state does not allow it (409)
EXIT_TIMEOUT = 7  # --timeout passed before the job ended
EXIT_INTERRUPTED = 130  # Ctrl-C

# The API's field names, as the options that set them (a 400's `fields` names the option).
OPTION_OF_FIELD = {
    "job_agent_id": "--agent", "labels": "--label",
    "job_agent_config": "--config (or the command after --)",
    "dispatch_context": "--context", "priority": "--priority",
    "max_attempts": "--max-attempts", "delay_seconds": "--delay-seconds",
    "retry_backoff_seconds": "--retry-backoff-seconds",
    "max_runtime_seconds": "--max-runtime-seconds", "expires_at": "--expires-at",
    "external_id": "--external-id", "group": "--group", "hold": "--hold",
    "idempotency_key": "--idempotency-key", "reason": "--reason", "status": "--status",
    "concurrency_key": "--concurrency-key", "concurrency_limit": "--concurrency-limit",
    "rate_limit_key": "--rate-limit-key", "key": "KEY", "count": "--count",
    "period_seconds": "--period-seconds",
    "fairness_key": "--fairness-key", "weight": "--weight",
    "attempt": "--attempt", "page_size": "--limit",
}


MESSAGE_LINES = 10  # of a job's message, in its text


class UsageError(Exception):
    """A mistake in what the user typed or set: exit 2, the message names what to change."""


class CommandFailed(Exception):
    """An outcome that is not an API error but ends the command with `exit_code` (a wait that
    timed out, an artifact the server named oddly); `message` says what to do."""

    def __init__(self, message: str, exit_code: int, code: str):
        super().__init__(message)
        self.exit_code = exit_code
        self.code = code


def exit_code_of(exc: ApiError) -> int:
    if isinstance(exc, AuthError):
        return EXIT_AUTH
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, Conflict):
        return EXIT_CONFLICT
    if isinstance(exc, InvalidRequest):
        return EXIT_USAGE
    return EXIT_UNAVAILABLE  # TransportError, ServerError, Throttled, anything else


def explain(exc: ApiError, *, what: str, settings) -> str:
    """One message for an error answer: what happened and what to change. `what` names the
    object of the command ("job 37d9…", "group run-42", "artifact a.txt of job 37d9…")."""
    if isinstance(exc, TransportError):
        return (f"no answer from {settings.url} ({exc.detail}): check JOBQUEUE_URL (or --url) "
                "and that the server is running")
    if isinstance(exc, AuthError):
        if settings.api_key.startswith("jqa_"):
            return (f"the server refused the credential ({exc.code}): JOBQUEUE_API_KEY (or "
                    "--api-key) holds an agent token (jqa_…); the producer commands need "
                    "the workspace's API key (jqk_…)")
        if exc.status == 403:
            return (f"the server refused this credential here ({exc.code}): the producer "
                    "commands need a workspace API key (jqk_…) in JOBQUEUE_API_KEY (or "
                    "--api-key), not an agent token (jqa_…)")
        return (f"the server refused the API key ({exc.code}): set JOBQUEUE_API_KEY (or "
                f"--api-key) to a valid API key of workspace {settings.workspace} "
                "(`manage.py create_workspace NAME` prints one; keys are shown once)")
    if isinstance(exc, NotFound):
        return (f"{what} not found ({exc.code}): check it, and that JOBQUEUE_WORKSPACE (or "
                f"--workspace, now {settings.workspace}) is the workspace it belongs to")
    if isinstance(exc, Throttled):
        after = f" after {exc.retry_after:g} s" if exc.retry_after is not None else " later"
        return f"the server is throttling this API key ({exc.code}): try again{after}"
    if isinstance(exc, Conflict):
        hint = {
            "job_finished": "it has already ended; `jobqueue jobs requeue ID` runs it again",
            "invalid_transition": "the job's status does not allow it (see `jobqueue jobs "
                                  "get ID`)",
            "group_cancelled": "the group was cancelled and takes no more jobs: use a new "
                               "--group",
            "unique_key_conflict": "the live job with this --unique-key is another agent's: "
                                   "put the agent in the key, or drop --on-conflict replace "
                                   "and --debounce-seconds",
        }.get(exc.code, "")
        return f"{what}: {exc.detail} ({exc.code})" + (f": {hint}" if hint else "")
    if isinstance(exc, InvalidRequest):
        if exc.code == "idempotency_key_reused":
            return (f"{exc.detail} ({exc.code}): send the same fields again, or use a new "
                    "--idempotency-key")
        problems = [f"{OPTION_OF_FIELD.get(name, name)}: {' '.join(map(str, msgs))}"
                    if isinstance(msgs, list) else f"{OPTION_OF_FIELD.get(name, name)}: {msgs}"
                    for name, msgs in exc.fields.items()]
        return (f"the server refused the request ({exc.code}): "
                + ("; ".join(problems) if problems else exc.detail))
    return (f"the server failed ({exc.status} {exc.code}: {exc.detail}); try again later, "
            "and tell its operator if it persists")


class Output:
    """Where a command's results and errors go: stdout for results, stderr for the rest."""

    def __init__(self, machine: bool):
        self.machine = machine

    # -- results --

    def document(self, obj: Any) -> None:
        """One JSON document (--json)."""
        print(json.dumps(obj, indent=2, ensure_ascii=False), flush=True)

    def line(self, obj: Any) -> None:
        """One compact JSON line (--json with --follow: JSON Lines)."""
        print(json.dumps(obj, ensure_ascii=False), flush=True)

    def text(self, text: str) -> None:
        print(text, flush=True)

    def write(self, text: str) -> None:
        """As it is, no newline added (a JSON array printed item by item)."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def note(self, text: str) -> None:
        """Something for the person at the terminal (stderr; not in machine output)."""
        if not self.machine:
            print(text, file=sys.stderr, flush=True)

    def raw(self, data: bytes) -> None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    # -- errors --

    def error(self, message: str, *, code: str, exit_code: int, status: int | None = None,
              fields: dict | None = None) -> int:
        if self.machine:
            body = {"error": {"code": code, "message": message, "status": status,
                              "fields": fields or {}}, "exit_code": exit_code}
            print(json.dumps(body, ensure_ascii=False), file=sys.stderr, flush=True)
        else:
            print(f"jobqueue: error: {message}", file=sys.stderr, flush=True)
        return exit_code


# --- text for people -----------------------------------------------------------------------


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _visible(text: str) -> str:
    """`text` with its control characters but line breaks and tabs written out (`\\x1b`):
    an agent's message or a job's field is somebody else's text, and an escape sequence in
    it must not reach the terminal (clear the screen, set the clipboard, hide a line)."""
    return "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc"
                   else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in text)


def _rows(pairs: Iterable[tuple[str, Any]]) -> str:
    pairs = [(k, v) for k, v in pairs if v not in (None, "", [], {})]
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}  "
                     + _visible(str(v)).replace("\n", "\n" + " " * (width + 2))
                     for k, v in pairs)


def _head(text: str, lines: int = MESSAGE_LINES) -> str:
    """The first `lines` lines of a (report's) message, and how many more there are."""
    kept = text.strip("\n").splitlines()
    more = len(kept) - lines
    return "\n".join(kept[:lines]) + (f"\n… ({more} more lines: --json has them)" if more > 0
                                      else "")


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[_visible(str(c)) if c not in (None, "") else "-" for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = [headers, *cells]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def job_text(job: dict, *, events: bool = False) -> str:
    """A job (any of the API's shapes: summary, job, detail) for people."""
    claim = job.get("claim")
    lease = None
    if claim:
        lease = (f"attempt {claim['attempt']}, lease {claim['lease_state']} until "
                 f"{claim['claim_expires_at']} (last heartbeat "
                 f"{claim.get('heartbeat_at') or 'none yet'})")
    message = job.get("message") or ""
    parts = [_rows([
        ("id", job.get("id")),
        ("status", job.get("status")),
        ("job_agent_id", job.get("job_agent_id")),
        ("labels", ", ".join(job.get("labels") or []) or None),
        ("attempt", f"{job.get('attempt')} of {job.get('max_attempts')}"),
        ("priority", job.get("priority")),
        ("group", job.get("group")),
        ("external_id", job.get("external_id")),
        ("idempotency_key", job.get("idempotency_key")),
        ("unique_key", job.get("unique_key")),
        ("concurrency_key", job.get("concurrency_key")),
        ("concurrency_limit", job.get("concurrency_limit")),
        ("rate_limit_key", job.get("rate_limit_key")),
        ("fairness_key", job.get("fairness_key")),
        ("depends_on", ", ".join(job.get("depends_on") or []) or None),
        ("waiting_on", ", ".join(job.get("waiting_on") or []) or None),
        ("max_runtime", f"{job['max_runtime_seconds']} s"
         if job.get("max_runtime_seconds") else None),
        ("expires_at", job.get("expires_at")),
        ("available_at", job.get("available_at") if job.get("status") == "queued" else None),
        ("created_at", job.get("created_at")),
        ("started_at", job.get("started_at")),
        ("completed_at", job.get("completed_at")),
        ("claim", lease),
        ("config", _compact(job["job_agent_config"]) if job.get("job_agent_config") else None),
        ("context_keys", ", ".join(job.get("dispatch_context_keys") or [])),
        ("result", _compact(job["result"]) if job.get("result") is not None else None),
        ("message", _head(message) if message.strip() else None),
    ])]
    attempts = job.get("attempts") or []
    if attempts:
        parts.append("\nattempts:\n" + table(
            ["N", "CLAIMED_AT", "ENDED_AT", "OUTCOME", "MESSAGE"],
            [[a["number"], a["claimed_at"], a.get("ended_at"), a.get("outcome") or "running",
              (a.get("message") or "").splitlines()[0] if a.get("message") else ""]
             for a in attempts]))
    if events and job.get("events"):
        parts.append("\nevents:\n" + table(
            ["AT", "KIND", "ATTEMPT", "ACTOR", "DETAIL"],
            [[e["created_at"], e["kind"] + (f" x{e['count']}" if e.get("count", 1) > 1 else ""),
              e["attempt"], e.get("actor"), _compact(e["detail"]) if e.get("detail") else ""]
             for e in job["events"]]))
    return "\n".join(parts)


# A list is printed as it is read (`--all` may be millions of jobs), so its columns have
# fixed widths, wide enough for what they hold (an id is 36 characters, the longest status
# 11, a timestamp 27), and the group, of any length, comes last.
JOB_COLUMNS = [("ID", 36), ("STATUS", 11), ("ATTEMPT", 7), ("PRIORITY", 8), ("CREATED_AT", 27),
               ("GROUP", 0)]


def _fixed(cells: list[str]) -> str:
    return "  ".join(c.ljust(w) for c, (_, w) in zip(cells, JOB_COLUMNS, strict=True)).rstrip()


def jobs_header() -> str:
    return _fixed([name for name, _ in JOB_COLUMNS])


def job_row(job: dict) -> str:
    return _fixed([job["id"], job["status"], f"{job['attempt']}/{job['max_attempts']}",
                   str(job["priority"]), job["created_at"], job.get("group") or "-"])


def _reason_value(value) -> str:
    """A field of an explain reason: a list joined, null as "none" (rate_limited's limit
    fields when the key has no limit)."""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return "none" if value is None else str(value)


def explain_text(job_id: str, explanation: dict) -> str:
    """Why a job is not running (GET jobs/{id}/explain) for people: its status, whether a
    claim would take it, the agents it may go to, then each reason's code and detail (and
    what the reason names: waiting_on, available_at, ...)."""
    reasons = explanation.get("reasons") or []
    agents = explanation.get("agents") or {}
    if not explanation.get("claimable"):
        claimable = "no"
    elif reasons:
        claimable = "yes: a matching agent's claim would take it (see the reasons)"
    else:
        claimable = "yes: the next claim of a matching agent takes it"
    head = _rows([
        ("job", job_id),
        ("status", explanation.get("status")),
        ("claimable", claimable),
        ("agents", f"{agents.get('matching', 0)} matching, {agents.get('online', 0)} online"),
        ("reasons", "none" if not reasons else None),
    ])
    if not reasons:
        return head
    rows = _rows([(r.get("code", "?"), "\n".join([r.get("detail", ""), *(
        f"{k}: {_reason_value(v)}" for k, v in r.items() if k not in ("code", "detail"))]))
        for r in reasons])
    return head + "\nreasons:\n" + "\n".join("  " + line for line in rows.splitlines())


def group_text(group: dict) -> str:
    counts = group.get("counts") or {}
    order = ["pending", "queued", "in_progress", "successful", "failure", "cancelled",
             "expired"]
    names = [s for s in order if s in counts] + sorted(set(counts) - set(order))
    return _rows([
        ("group", group.get("group")),
        ("finished", "yes" if group.get("finished") else "no (jobs are pending, queued or "
                                                         "in progress)"),
        ("cancelled_at", group.get("cancelled_at")),
        ("jobs", sum(counts.values())),
    ]) + "\n" + "\n".join(f"  {name.ljust(12)} {counts[name]}" for name in names)


def schedule_text(schedule: dict) -> str:
    """A schedule for people: its cron in its time zone, its next fires, its last one."""
    job = schedule.get("job") or {}
    fires = schedule.get("fires") or {}
    shown = {k: v for k, v in job.items() if k not in ("job_agent_id", "dispatch_context_keys")}
    return _rows([
        ("id", schedule.get("id")),
        ("name", schedule.get("name")),
        ("cron", f"{schedule.get('cron')}  ({schedule.get('timezone')})"),
        ("overlap", schedule.get("overlap")),
        ("catchup_window", f"{schedule.get('catchup_window_seconds')} s"),
        ("paused", f"yes, since {schedule.get('paused_at')}" if schedule.get("paused") else "no"),
        ("next_fires", "\n".join(schedule.get("next_fire_times") or [])),
        ("last_fire_at", schedule.get("last_fire_at")),
        ("last_job_id", schedule.get("last_job_id")),
        ("fires", ", ".join(f"{k} {fires[k]}" for k in ("fired", "skipped", "missed")
                            if k in fires)),
        ("job_agent_id", job.get("job_agent_id")),
        ("job", _compact(shown) if shown else None),
        ("context_keys", ", ".join(job.get("dispatch_context_keys") or [])),
    ])


def schedules_table(schedules: list[dict]) -> str:
    return table(["ID", "NAME", "CRON", "TIMEZONE", "PAUSED", "NEXT_FIRE"],
                 [[s["id"], s["name"], s["cron"], s["timezone"], "yes" if s["paused"] else "no",
                   (s.get("next_fire_times") or [None])[0]] for s in schedules])


def rate_limit_text(limit: dict) -> str:
    """A rate limit for people: its key, and how many of its jobs may be claimed per period."""
    return _rows([
        ("key", limit.get("key")),
        ("limit", f"{limit.get('count')} claims per {limit.get('period_seconds')} s"),
        ("created_at", limit.get("created_at")),
        ("updated_at", limit.get("updated_at")),
    ])


def rate_limits_table(limits: list[dict]) -> str:
    return table(["KEY", "COUNT", "PERIOD_SECONDS", "UPDATED_AT"],
                 [[item["key"], item["count"], item["period_seconds"], item.get("updated_at")]
                  for item in limits])


def fairness_weight_text(weight: dict) -> str:
    """A fairness key's weight for people: its key, and its share against the others'."""
    return _rows([
        ("key", weight.get("key")),
        ("weight", weight.get("weight")),
        ("created_at", weight.get("created_at")),
        ("updated_at", weight.get("updated_at")),
    ])


def fairness_keys_table(weights: list[dict]) -> str:
    return table(["KEY", "WEIGHT", "UPDATED_AT"],
                 [[item["key"], item["weight"], item.get("updated_at")] for item in weights])


def artifacts_table(artifacts: list[dict]) -> str:
    return table(["NAME", "SIZE", "SHA256", "CONTENT_TYPE", "ATTEMPT"],
                 [[a["name"], a["size"], a["sha256"], a.get("content_type"), a.get("attempt")]
                  for a in artifacts])


def log_document(job_id: str, chunk: LogChunk) -> dict:
    return {"job_id": job_id, "attempt": chunk.attempt, "offset": chunk.offset,
            "length": chunk.length, "text": chunk.text}
