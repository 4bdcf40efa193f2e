"""A job's artifacts: `upload_artifacts` sends the files the child left in JOB_ARTIFACTS_DIR
(staged for the claim's attempt: its successful report publishes them), from the job's
thread, before that report."""

from __future__ import annotations

import logging
import re
import time

from .agentlog import log_event
from .backoff import Backoff
from .client import AgentClient
from .errors import ApiError, LeaseLost
from .lease import Lease
from .workdir import ChildFileError, JobDir

# Artifacts: the files the child leaves in JOB_ARTIFACTS_DIR, uploaded before a successful
# report (the server's defaults: JOBQUEUE_MAX_ARTIFACT_BYTES, ..._ARTIFACTS_PER_ATTEMPT).
ARTIFACT_MAX_BYTES = 100 * 1024 * 1024
ARTIFACT_MAX_FILES = 100
ARTIFACT_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


def upload_artifacts(client: AgentClient, lease: Lease, jobdir: JobDir, *,
                     max_files: int = ARTIFACT_MAX_FILES,
                     max_bytes: int = ARTIFACT_MAX_BYTES) -> str:
    """Upload every file the child left in JOB_ARTIFACTS_DIR (staged for this attempt;
    the successful report publishes them). Returns "" when all went up, else why not
    (the job then reports failure); a lost lease is marked, and nothing is published."""
    names = jobdir.artifact_names()
    if len(names) > max_files:
        return (f"JOB_ARTIFACTS_DIR holds {len(names)} entries; at most "
                f"{max_files} are uploaded")
    for name in names:
        if not ARTIFACT_NAME.fullmatch(name) or name in (".", ".."):
            return "JOB_ARTIFACTS_DIR: a file name is not 1-200 of A-Z a-z 0-9 . _ -"
        backoff = Backoff(0.2, 5.0)
        while True:
            try:
                with jobdir.open_artifact(name, max_bytes) as fh:
                    info = client.upload_artifact(
                        lease.job_id, lease.claim_id, name, fh.chunks(), fh.size,
                        timeout=max(client.timeout, 300.0))
            except ChildFileError as exc:
                return f"artifact {name} {exc}"
            except LeaseLost as exc:
                lease.mark_lost(exc.code)
                log_event("upload_refused", level=logging.WARNING, job=lease.job_id,
                          attempt=lease.attempt, code=exc.code, published="nothing")
                return f"artifact upload refused ({exc.code})"
            except ApiError as exc:
                if exc.transient and time.monotonic() < lease.deadline and not lease.lost:
                    delay = exc.retry_after if exc.retry_after is not None else backoff.next()
                    log_event("upload_retry", level=logging.WARNING, job=lease.job_id,
                              attempt=lease.attempt, code=exc.code, url=exc.url,
                              retry_in=delay)
                    time.sleep(delay)
                    continue
                return f"artifact {name} was not uploaded ({exc.code})"
            log_event("artifact_uploaded", job=lease.job_id, attempt=lease.attempt,
                      name=name, size=info.get("size"))
            break
    return ""
