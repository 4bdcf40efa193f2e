"""The agent's config file: what `jobqueue-agent register` writes, what `jobqueue-agent
--config FILE` runs with, and what the agent's token rotation rewrites (docs/cli.md).

One JSON object: `server`, `workspace`, `agent`, `token`, and about the token
`token_expires_at` (the server's, ISO 8601; null: it never expires), `token_lifetime_seconds`
(how long it had to live when it was received: its expiry less the answer's `Date`, so that
the two machines' clocks need not agree) and `token_received_at` (this machine's clock, Unix
seconds); also `name`, `labels` and the server's `settings`.

Written whole to a temporary file in the same directory (created with mode 0600, fsync'd), then
renamed over the old one (os.replace: atomic on POSIX) and the directory fsync'd. A reader, the
agent starting again after a crash or a SIGKILL included, finds the old file or the new one,
never a mix or none. Nothing here logs the token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import email.utils
import json
import os
import tempfile
import time
from pathlib import Path

REQUIRED = ("server", "workspace", "agent", "token")
# The share of a token's lifetime after which the agent rotates it.
ROTATE_AT = 0.75


class ConfigError(Exception):
    """The config file is missing, unreadable or incomplete (the message says which; it never
    quotes the file's content)."""


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    server: str
    workspace: str
    agent: str
    token: str = dataclasses.field(repr=False)
    token_expires_at: str | None = None
    token_lifetime_seconds: float | None = None
    token_received_at: float | None = None
    name: str = ""
    labels: tuple[str, ...] = ()
    settings: dict = dataclasses.field(default_factory=dict)

    def rotate_after(self) -> float | None:
        """When (this machine's clock, Unix seconds) the token is due for rotation: at 75 % of
        its lifetime; None for a token that never expires."""
        if self.token_lifetime_seconds is None or self.token_received_at is None:
            return None
        return self.token_received_at + ROTATE_AT * self.token_lifetime_seconds

    def with_token(self, token: str, expires_at: str | None, server_date: str | None,
                   received_at: float | None = None) -> AgentConfig:
        """This config with a new token, as an answer carrying it (its `token_expires_at`
        and the answer's `Date` header) describes it."""
        return dataclasses.replace(
            self, token=token, token_expires_at=expires_at,
            token_lifetime_seconds=lifetime_seconds(expires_at, server_date),
            token_received_at=time.time() if received_at is None else received_at)


def _parse_iso(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def lifetime_seconds(expires_at: str | None, server_date: str | None) -> float | None:
    """How long a token expiring at `expires_at` (the server's clock) has to live, measured
    from the answer's `Date` (the same clock); None when it never expires. Without a usable
    Date header, from this machine's clock."""
    if not expires_at:
        return None
    ends = _parse_iso(expires_at)
    now = None
    if server_date:
        try:
            now = email.utils.parsedate_to_datetime(server_date)
        except (TypeError, ValueError):
            now = None
    if now is None or now.tzinfo is None:
        now = dt.datetime.now(dt.UTC)
    return max(0.0, (ends - now).total_seconds())


def load(path: str | os.PathLike) -> AgentConfig:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"no config file at {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the config file {path}: {type(exc).__name__}") from None
    except ValueError:
        raise ConfigError(f"the config file {path} is not JSON") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the config file {path} is not a JSON object")
    missing = [name for name in REQUIRED if not isinstance(data.get(name), str) or not data[name]]
    if missing:
        raise ConfigError(f"the config file {path} lacks " + ", ".join(missing))
    known = {f.name for f in dataclasses.fields(AgentConfig)}
    values = {k: v for k, v in data.items() if k in known}
    values["labels"] = tuple(values.get("labels") or ())
    values["settings"] = dict(values.get("settings") or {})
    return AgentConfig(**values)


def save(path: str | os.PathLike, config: AgentConfig) -> None:
    """Replace the file at `path` with `config`, atomically, mode 0600."""
    target = Path(path)
    data = dataclasses.asdict(config)
    data["labels"] = list(config.labels)
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                dir=target.parent or ".")  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o600)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:  # pragma: no cover -- a directory that cannot be opened: best effort
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover -- some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def check_writable(path: str | os.PathLike) -> None:
    """Raise OSError unless a config file can be written at `path` (its directory takes a new
    file): before registering, so that the token shown once is never lost to a bad path."""
    target = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                dir=target.parent or ".")
    os.close(fd)
    os.unlink(temp)


def remove_temporaries(path: str | os.PathLike) -> int:
    """Remove what an interrupted save left beside the file (`.NAME.*.tmp`, a token inside);
    the agent does it when it starts. Returns how many."""
    target = Path(path)
    removed = 0
    for stale in (target.parent or Path(".")).glob(f".{target.name}.*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()
            removed += 1
    return removed
