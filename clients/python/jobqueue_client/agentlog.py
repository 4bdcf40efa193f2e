"""The agent's own log: one line per event (`event=... job=... key=value`) on the
`jobqueue.agent` logger. Every thread of the agent writes through `log_event`; nothing it logs
is a secret (no context, result or token)."""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("jobqueue.agent")


def log_event(event: str, *, level: int = logging.INFO, job: str | None = None,
              attempt: int | None = None, **fields: Any) -> None:
    """One line per event: `event=... job=... attempt=... key=value ...`. Callers pass only
    non-secret values (ids, codes, counts, durations), never contexts, results or tokens."""
    parts = [f"event={event}"]
    if job is not None:
        parts.append(f"job={job}")
    if attempt is not None:
        parts.append(f"attempt={attempt}")
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.3f}"
        text = str(value).replace("\n", " ")
        if " " in text:
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    log.log(level, " ".join(parts))
