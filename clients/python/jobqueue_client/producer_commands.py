"""What each `jobqueue` command does (producer_cli.py parses the command line and calls one):
`cmd_<command>(client, args, out)` calls the ProducerClient, prints through cli_output's
`Output`, and returns the exit status; an outcome that is not an API error raises UsageError
or CommandFailed, which main() turns into its message and exit status.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .cli_output import (
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_NOT_SUCCESSFUL,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    CommandFailed,
    Output,
    UsageError,
    artifacts_table,
    explain_text,
    fairness_keys_table,
    fairness_weight_text,
    group_text,
    job_row,
    job_text,
    jobs_header,
    log_document,
    rate_limit_text,
    rate_limits_table,
    schedule_text,
    schedules_table,
)
from .errors import ApiError, Throttled
from .producer import TERMINAL_STATUSES, LogChunk, ProducerClient, WaitTimeout, _backoff

MAX_PAGE_SIZE = 500  # the API's largest page_size


def read_object(value: str, option: str, *, inline: bool = False) -> dict:
    """A JSON object from a file, `-` (stdin) or, with `inline`, the text itself (`{…}`).
    Errors name the option and never quote the content (a context may hold secrets)."""
    if inline and value.lstrip().startswith("{"):
        text, where = value, "the value"
    elif value == "-":
        where = "stdin"
        binary = getattr(sys.stdin, "buffer", None)  # None: a text stream put in its place
        try:
            text = (binary.read().decode("utf-8-sig") if binary is not None
                    else sys.stdin.read())
        except UnicodeDecodeError:
            raise UsageError(f"{option}: stdin is not UTF-8 text") from None
    else:
        try:
            text = Path(value).read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{option}: cannot read {value!r}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
        where = repr(value)
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):  # an argument's undecodable bytes
        raise UsageError(f"{option}: {where} is not UTF-8 text")

    def not_json(constant):
        raise ValueError(f"{constant} is not a JSON number")

    try:
        obj = json.loads(text, parse_constant=not_json)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option}: {where} is not JSON (line {exc.lineno}, column "
                         f"{exc.colno}: {exc.msg})") from None
    except ValueError as exc:  # NaN, Infinity: JSON has no such numbers
        raise UsageError(f"{option}: {where} is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{option}: {where} holds a JSON {type(obj).__name__}; it must be an "
                         "object ({…})")
    return obj



def cmd_create(client: ProducerClient, args, out: Output) -> int:
    if not args.agent and not args.label:
        raise UsageError("jobs create: set --agent ID (or JOBQUEUE_AGENT): the job agent "
                         "that runs the job, or --label LABEL (repeatable): the labels of "
                         "the agents that may")
    if args.timeout is not None and not args.wait:
        raise UsageError("jobs create: --timeout applies only with --wait")
    if args.config == "-" and args.context == "-":
        raise UsageError("jobs create: only one of --config and --context can read stdin (-)")
    config = read_object(args.config, "--config", inline=True) if args.config else None
    context = read_object(args.context, "--context") if args.context else None
    if args.command:
        if config is not None and "command" in config:
            raise UsageError("jobs create: give the command either in --config or after --, "
                             "not both")
        config = {**(config or {}), "command": args.command}
    job = client.create_job(
        None if args.label else args.agent, labels=args.label,  # --label beats JOBQUEUE_AGENT
        job_agent_config=config, dispatch_context=context,
        priority=args.priority, max_attempts=args.max_attempts,
        delay_seconds=args.delay_seconds, retry_backoff_seconds=args.retry_backoff_seconds,
        max_runtime_seconds=args.max_runtime_seconds, expires_at=args.expires_at,
        external_id=args.external_id, group=args.group, hold=args.hold,
        idempotency_key=args.idempotency_key, unique_key=args.unique_key,
        unique_states=args.unique_states, on_conflict=args.on_conflict,
        debounce_seconds=args.debounce_seconds,
        debounce_max_seconds=args.debounce_max_seconds, depends_on=args.depends_on,
        concurrency_key=args.concurrency_key, concurrency_limit=args.concurrency_limit,
        rate_limit_key=args.rate_limit_key, fairness_key=args.fairness_key)
    if job.get("deduplicated"):
        out.note(f"a live job with that unique key answered: {job['id']} ({job['status']}); "
                 "no job created")
    if args.wait:
        verb = "found" if job.get("deduplicated") else "created"
        out.note(f"{verb} job {job['id']} ({job['status']}); waiting for it to end")
        return wait_for_end(client, job["id"], args, out)
    show_job(job, args, out)
    return EXIT_OK


def show_job(job: dict, args, out: Output) -> None:
    if out.machine:
        out.document(job)
    elif getattr(args, "quiet", False):
        out.text(job["id"])
    else:
        out.text(job_text(job, events=getattr(args, "events", False)))


def outcome(job: dict) -> int:
    return EXIT_OK if job["status"] == "successful" else EXIT_NOT_SUCCESSFUL


def wait_for_end(client: ProducerClient, job_id: str, args, out: Output) -> int:
    """Wait for the job's end, show it, and exit by its status (0 successful, 1 not)."""
    try:
        job = client.wait(job_id, timeout=args.timeout)
    except WaitTimeout as exc:
        show_job(exc.job, args, out)
        raise CommandFailed(
            f"job {job_id} is still {exc.job.get('status')} after {args.timeout:g} s (it goes "
            f"on): wait again with `jobqueue jobs wait {job_id}`", EXIT_TIMEOUT,
            "timeout") from None
    except KeyboardInterrupt:
        raise CommandFailed(
            f"stopped waiting; job {job_id} goes on (`jobqueue jobs wait {job_id}`, or "
            f"`jobqueue jobs cancel {job_id}`)", EXIT_INTERRUPTED, "interrupted") from None
    show_job(job, args, out)
    if job["status"] != "successful":
        out.note(f"job {job_id} ended {job['status']}")
    return outcome(job)


def cmd_get(client, args, out) -> int:
    show_job(client.get(args.id), args, out)
    return EXIT_OK


def cmd_explain(client, args, out) -> int:
    explanation = client.explain_job(args.id)
    if out.machine:
        out.document(explanation)
    else:
        out.text(explain_text(args.id, explanation))
    return EXIT_OK


def cmd_wait(client, args, out) -> int:
    job = client.get(args.id)  # at once: a wrong id, key or URL fails here, not after retries
    if job["status"] in TERMINAL_STATUSES:
        show_job(job, args, out)
        return outcome(job)
    return wait_for_end(client, args.id, args, out)


def cmd_list(client, args, out) -> int:
    """Printed as the pages come (a JSON array too): `--all` holds no list in memory."""
    limit = None if args.all else args.limit
    # One more than shown, to tell whether there were more.
    page_size = MAX_PAGE_SIZE if limit is None else min(MAX_PAGE_SIZE, limit + 1)
    jobs = client.list(status=args.status, group=args.group, job_agent_id=args.agent,
                       page_size=page_size, limit=None if limit is None else limit + 1)
    shown = 0
    for job in jobs:
        if shown == limit:
            out.note(f"(the newest {limit}; --limit N or --all for more)")
            break
        if out.machine:
            out.write(("[\n  " if shown == 0 else ",\n  ") + json.dumps(job, ensure_ascii=False))
        else:
            out.text((jobs_header() + "\n" if shown == 0 else "") + job_row(job))
        shown += 1
    if out.machine:
        out.write("\n]\n" if shown else "[]\n")
    elif not shown:
        out.note("no jobs match")
    return EXIT_OK


def cmd_cancel(client, args, out) -> int:
    show_job(client.cancel(args.id, args.reason), args, out)
    return EXIT_OK


def cmd_requeue(client, args, out) -> int:
    show_job(client.requeue(args.id, args.reason), args, out)
    return EXIT_OK


def cmd_dispatch(client, args, out) -> int:
    show_job(client.dispatch(args.id), args, out)
    return EXIT_OK


def cmd_logs(client, args, out) -> int:
    """Print the log from byte 0; with --follow, read again until the job has ended (the
    long-poll GET jobs/{id}?wait_seconds paces the reads and answers at once at the end),
    going on to each later attempt's log unless --attempt names one."""
    attempt, offset, printed = args.attempt, 0, False
    # Following, a read that a later try may not meet (network, 5xx, 429) is tried again
    # with wait()'s backoff, as `jobs wait` does: a server restart does not end the follow.
    again = _retrying if args.follow else (lambda call, *a, **k: call(*a, **k))
    job = again(client.get, args.id) if args.follow else None
    whole = bytearray()  # --json without --follow: one document, however many reads
    try:
        while True:
            chunk = again(client.read_log, args.id, attempt=attempt, offset=offset)
            attempt = chunk.attempt if attempt is None else attempt
            if chunk.data:
                printed = True
                if not out.machine:
                    out.raw(chunk.data)
                elif args.follow:
                    out.line(log_document(args.id, chunk))
                else:
                    whole += chunk.data
            offset = chunk.next_offset
            if offset < chunk.length:
                continue  # more is there already (a read answers at most 16 MiB)
            if not args.follow:
                if out.machine:
                    out.document(log_document(args.id, LogChunk(bytes(whole), chunk.attempt,
                                                                0, chunk.length)))
                return EXIT_OK
            # A later attempt first: the job may have retried and ended within one wait,
            # and the later attempt's log is read to its end before the job's end is told.
            if args.attempt is None and job["attempt"] > attempt:
                attempt, offset = job["attempt"], 0
                if printed:
                    out.note(f"--- attempt {attempt} ---")
                continue
            if job["status"] in TERMINAL_STATUSES or (args.attempt and job["attempt"] > attempt):
                return outcome(job) if job["status"] in TERMINAL_STATUSES else EXIT_OK
            started = time.monotonic()
            job = again(client.get, args.id, wait_seconds=min(client.max_wait_seconds,
                                                              max(1, round(args.interval))))
            if job["status"] not in TERMINAL_STATUSES:  # a server at its cap answers early
                time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        raise CommandFailed("stopped following the log; the job goes on", EXIT_INTERRUPTED,
                            "interrupted") from None


def _retrying(call, *args, **kwargs):
    """call(*args, **kwargs), tried again after a transient error (network, 5xx, 429: the
    server's Retry-After, else ProducerClient.wait's backoff) for as long as it takes."""
    failures = 0
    while True:
        try:
            return call(*args, **kwargs)
        except ApiError as exc:
            if not exc.transient:
                raise
            failures += 1
            pause = _backoff(failures)
            if isinstance(exc, Throttled) and exc.retry_after is not None:
                pause = exc.retry_after
            time.sleep(pause)


def cmd_artifacts(client, args, out) -> int:
    if args.name and not args.download:
        raise UsageError("jobs artifacts: --name applies only with --download DIR")
    artifacts = client.list_artifacts(args.id)
    if not args.download:
        if out.machine:
            out.document(artifacts)
        elif artifacts:
            out.text(artifacts_table(artifacts))
        else:
            out.note(f"job {args.id} has no published artifacts (a job publishes its "
                     "artifacts when it ends successful)")
        return EXIT_OK
    names = [a["name"] for a in artifacts]
    wanted = args.name or names
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise CommandFailed(
            f"job {args.id} published no artifact named {', '.join(unknown)} (it published: "
            f"{', '.join(names) or 'none'}): check --name", EXIT_NOT_FOUND, "not_found")
    target = Path(args.download)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--download: cannot make the directory {args.download!r}: "
                         f"{exc.strerror or exc}") from None
    saved = []
    for name in wanted:
        if name in ("", ".", "..") or Path(name).name != name or "\\" in name:
            raise CommandFailed(f"the server named an artifact {name!r}, which is not a file "
                                "name: not saved", EXIT_UNAVAILABLE, "invalid_response")
        path = target / name
        try:
            info = client.download_artifact(args.id, name, path)
        except OSError as exc:  # a directory of that name, no room, no write permission
            raise UsageError(f"--download: cannot write {str(path)!r}: "
                             f"{exc.strerror or exc}") from None
        saved.append({**info, "path": str(path)})
        out.note(f"saved {path} ({info['size']} bytes, sha256 {info['sha256']})")
    if out.machine:
        out.document(saved)
    elif not saved:
        out.note(f"job {args.id} has no published artifacts: nothing saved")
    return EXIT_OK


def cmd_flow_create(client, args, out) -> int:
    flow = read_object(args.file, "FILE")
    jobs = flow.get("jobs")
    if not isinstance(jobs, list):
        raise UsageError('flows create: FILE must hold {"jobs": [{"ref": …, "job_agent_id": '
                         '…, "depends_on_refs": […]}, …]}')
    made = client.create_flow(jobs)
    if out.machine:
        out.document({"jobs": made})
    else:
        out.text("\n".join(f"{ref}  {job['id']}  {job['status']}" for ref, job in made.items()))
    return EXIT_OK


def cmd_group_get(client, args, out) -> int:
    group = client.group(args.name)
    if out.machine:
        out.document(group)
    else:
        out.text(group_text(group))
    return EXIT_OK


def cmd_group_cancel(client, args, out) -> int:
    cancelled = client.cancel_group(args.name, args.reason)
    if out.machine:
        out.document({"group": args.name, "cancelled": cancelled})
    else:
        out.text(f"group {args.name}: cancelled {cancelled} job{'s' * (cancelled != 1)}; it "
                 "takes no new jobs")
    return EXIT_OK



# --- schedules --------------------------------------------------------------------------------


def cmd_schedule_create(client, args, out) -> int:
    if not args.agent:
        raise UsageError("schedules create: set --agent ID (or JOBQUEUE_AGENT): the job agent "
                         "that runs its jobs")
    if args.config == "-" and args.context == "-":
        raise UsageError("schedules create: only one of --config and --context can read "
                         "stdin (-)")
    job: dict = {"job_agent_id": args.agent}
    config = read_object(args.config, "--config", inline=True) if args.config else None
    if args.command:
        if config is not None and "command" in config:
            raise UsageError("schedules create: give the command either in --config or after "
                             "--, not both")
        config = {**(config or {}), "command": args.command}
    if config is not None:
        job["job_agent_config"] = config
    if args.context:
        job["dispatch_context"] = read_object(args.context, "--context")
    for field in ("priority", "max_attempts", "max_runtime_seconds", "group", "unique_key"):
        if getattr(args, field) is not None:
            job[field] = getattr(args, field)
    schedule = client.create_schedule(
        args.name, args.cron, job, timezone=args.timezone, overlap=args.overlap,
        catchup_window_seconds=args.catchup_window_seconds, paused=args.paused or None)
    return _show_schedule(schedule, args, out)


def _show_schedule(schedule: dict, args, out) -> int:
    if out.machine:
        out.document(schedule)
    elif getattr(args, "quiet", False):
        out.text(schedule["id"])
    else:
        out.text(schedule_text(schedule))
    return EXIT_OK


def cmd_schedule_list(client, args, out) -> int:
    limit = None if args.all else args.limit
    page_size = MAX_PAGE_SIZE if limit is None else min(MAX_PAGE_SIZE, limit + 1)
    found = list(client.list_schedules(page_size=page_size,
                                       limit=None if limit is None else limit + 1))
    more = limit is not None and len(found) > limit
    found = found[:limit] if limit is not None else found
    if out.machine:
        out.document(found)
    elif found:
        out.text(schedules_table(found))
    else:
        out.note("no schedules")
    if more:
        out.note(f"(the newest {limit}; --limit N or --all for more)")
    return EXIT_OK


def cmd_schedule_get(client, args, out) -> int:
    return _show_schedule(client.get_schedule(args.id), args, out)


def cmd_schedule_pause(client, args, out) -> int:
    return _show_schedule(client.pause_schedule(args.id), args, out)


def cmd_schedule_resume(client, args, out) -> int:
    return _show_schedule(client.resume_schedule(args.id), args, out)


def cmd_schedule_trigger(client, args, out) -> int:
    job = client.trigger_schedule(args.id)
    if job.get("deduplicated"):
        out.note(f"a live job with the schedule's unique key answered: {job['id']} "
                 f"({job['status']}); no job created")
    show_job(job, args, out)
    return EXIT_OK


def cmd_schedule_delete(client, args, out) -> int:
    client.delete_schedule(args.id)
    if out.machine:
        out.document({"id": args.id, "deleted": True})
    else:
        out.text(f"schedule {args.id} deleted (its jobs stay)")
    return EXIT_OK


# --- rate limits ------------------------------------------------------------------------------


def _show_rate_limit(limit: dict, out) -> int:
    if out.machine:
        out.document(limit)
    else:
        out.text(rate_limit_text(limit))
    return EXIT_OK


def cmd_rate_limit_set(client, args, out) -> int:
    return _show_rate_limit(client.set_rate_limit(args.key, args.count, args.period_seconds),
                            out)


def cmd_rate_limit_get(client, args, out) -> int:
    return _show_rate_limit(client.get_rate_limit(args.key), out)


def cmd_rate_limit_delete(client, args, out) -> int:
    client.delete_rate_limit(args.key)
    if out.machine:
        out.document({"key": args.key, "deleted": True})
    else:
        out.text(f"rate limit of {args.key!r} deleted: its jobs are no longer held back by it")
    return EXIT_OK


def cmd_rate_limit_list(client, args, out) -> int:
    return _keyed_list(client.list_rate_limits, rate_limits_table, "rate limits", args, out)


def _keyed_list(listing, show, noun: str, args, out) -> int:
    """A listing by key (rate limits, fairness keys), up to --limit (or --all), and a note
    when there are more."""
    limit = None if args.all else args.limit
    page_size = MAX_PAGE_SIZE if limit is None else min(MAX_PAGE_SIZE, limit + 1)
    found = list(listing(page_size=page_size, limit=None if limit is None else limit + 1))
    more = limit is not None and len(found) > limit
    found = found[:limit] if limit is not None else found
    if out.machine:
        out.document(found)
    elif found:
        out.text(show(found))
    else:
        out.note(f"no {noun}")
    if more:
        out.note(f"(the first {limit} by key; --limit N or --all for more)")
    return EXIT_OK


# --- fair shares ------------------------------------------------------------------------------


def _show_fairness_weight(weight: dict, out) -> int:
    if out.machine:
        out.document(weight)
    else:
        out.text(fairness_weight_text(weight))
    return EXIT_OK


def cmd_fairness_set(client, args, out) -> int:
    return _show_fairness_weight(client.set_fairness_weight(args.key, args.weight), out)


def cmd_fairness_get(client, args, out) -> int:
    return _show_fairness_weight(client.get_fairness_weight(args.key), out)


def cmd_fairness_delete(client, args, out) -> int:
    client.delete_fairness_weight(args.key)
    if out.machine:
        out.document({"key": args.key, "deleted": True})
    else:
        out.text(f"weight of {args.key!r} deleted: the key weighs 1 again")
    return EXIT_OK


def cmd_fairness_list(client, args, out) -> int:
    return _keyed_list(client.list_fairness_keys, fairness_keys_table, "fairness key weights",
                       args, out)
