"""Terminal reports sent together: `ReportBatcher`, the reporter thread the agent runs when
it runs several jobs at once; the reports that wait at the same moment go in one batch
report (POST job-agents/{id}/reports)."""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .agentlog import log, log_event
from .client import AgentClient
from .errors import ApiError, InvalidRequest, Unsupported

# The server's default bound on one batch report (JOBQUEUE_MAX_REPORT_BATCH).
MAX_REPORT_BATCH = 500
# A report bigger than this (its result, mostly) goes alone; a batch stays well under the
# server's default body cap (JOBQUEUE_MAX_REQUEST_BYTES, 1 MiB).
BATCH_REPORT_ITEM_BYTES = 16 * 1024
BATCH_REPORT_BYTES = 512 * 1024


class _Single(Exception):  # noqa: N818 - an internal signal, not an error
    """This report must take the single path (alone, no batch report on the server, or the
    batch refused as a whole)."""


@dataclass
class _PendingReport:
    body: dict
    size: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class ReportBatcher(threading.Thread):
    """Group commit for terminal reports, used when the agent runs several jobs at once.

    A job thread hands in its report and waits for the answer. This thread sends the
    reports one request at a time: every report waiting at that moment goes in one request
    (POST job-agents/{id}/reports), those that arrive meanwhile in the next. A lone report
    goes at once through the single path, so nothing waits for company; under load one
    request and one transaction end many jobs. Each report gets the answer the single
    report would have given (accepted, LeaseLost, NotFound, or the request's own error), so
    the job thread's retry rules are unchanged. A server without batch reports (404/405),
    or a batch refused as a whole (400/413), sends its reports through the single path.
    """

    def __init__(self, client: AgentClient):
        super().__init__(name="reporter", daemon=True)
        self.client = client
        self.supported = True
        self._cond = threading.Condition()
        self._queue: deque[_PendingReport] = deque()
        self._stopped = False

    def report(self, job_id: str, claim_id: str, status: str, *, message: str | None = None,
               result: Any = None, retry: bool = False) -> None:
        """Raises what AgentClient.report() raises."""
        body: dict[str, Any] = {"job_id": job_id, "claim_id": claim_id, "status": status}
        if retry:
            body["retry"] = True
        size = 200 + len((message or "").encode("utf-8", "replace"))
        if message is not None:  # pragma: no branch -- always a text (fit_message)
            body["message"] = message
        if result is not None:
            body["result"] = result
            size += len(json.dumps(result))
        if self.supported and size <= BATCH_REPORT_ITEM_BYTES and self.is_alive():
            item = _PendingReport(body, size)
            with self._cond:
                queued = not self._stopped  # run() drains the queue before it returns
                if queued:  # pragma: no branch -- race: stopped since is_alive()
                    self._queue.append(item)
                    self._cond.notify()
            if queued:  # pragma: no branch -- race: stopped since is_alive()
                item.done.wait()
                if item.error is None:
                    return
                if not isinstance(item.error, _Single):
                    raise item.error
        self.client.report(job_id, claim_id, status, message=message, result=result,
                           retry=retry)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if not self._queue:
                    return
                batch, total = [self._queue.popleft()], 0
                total = batch[0].size
                while (self._queue and len(batch) < MAX_REPORT_BATCH
                       and total + self._queue[0].size <= BATCH_REPORT_BYTES):
                    batch.append(self._queue.popleft())
                    total += batch[-1].size
            self._send(batch)

    def _send(self, batch: list[_PendingReport]) -> None:
        errors: list[BaseException | None]
        if len(batch) == 1:
            # The body's own fields, not a second list of them (a list dropped `retry` once).
            body = dict(batch[0].body)
            try:
                self.client.report(body.pop("job_id"), body.pop("claim_id"), body.pop("status"),
                                   **body)
                errors = [None]
            except Exception as exc:  # noqa: BLE001 - handed to the job thread, as is
                errors = [exc]
        else:
            try:
                errors = list(self.client.report_batch([item.body for item in batch]))
                log_event("reported_batch", level=logging.DEBUG, reports=len(batch))
            except Unsupported:
                self.supported = False
                log_event("batch_report_unsupported", level=logging.WARNING, fallback="single")
                errors = [_Single()] * len(batch)
            except InvalidRequest as exc:
                log_event("batch_report_refused", level=logging.WARNING, code=exc.code,
                          reports=len(batch), fallback="single")
                errors = [_Single()] * len(batch)
            except ApiError as exc:
                errors = [exc] * len(batch)
            except Exception as exc:  # noqa: BLE001 - a bug must not leave job threads waiting
                log.exception("event=report_batch_error")
                errors = [exc] * len(batch)
        for item, error in zip(batch, errors, strict=True):
            item.error = error
            item.done.set()
