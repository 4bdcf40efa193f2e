"""The one place a terminal transition announces itself: `jobqueue.signals.job_finished`.

Every path that ends a job calls `announce_finished` once, with the jobs it ended, inside the
transaction that ended them (or, on an autocommit path, right after its one statement): the
signal is sent when that transaction commits (`transaction.on_commit`), never when it rolls
back, and never for a write that changed nothing (a refused report, a retried final report,
cancelling a cancelled job). A new path that ends jobs (clocks, retries, group cancel) calls it
the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db import transaction

from jobqueue import signals
from jobqueue.models import Job


def announce_finished(ended: Iterable[tuple[uuid.UUID, str]], *, actor: str = "") -> None:
    """Send job_finished for each (job_id, terminal status) once the current transaction
    commits (at once when there is none: the write has committed already)."""
    ended = list(ended)
    if ended:
        transaction.on_commit(lambda: _send(ended, actor))


def _send(ended: list[tuple[uuid.UUID, str]], actor: str) -> None:
    for job_id, status in ended:
        signals.job_finished.send_robust(sender=Job, job_id=job_id, status=status, actor=actor)
