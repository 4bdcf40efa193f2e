"""What a job asks the reference agent to run: its `job_agent_config`
(`{"command": [...], "env": {...}, "timeout_seconds": N}`), checked by `parse_config` into a
`JobSpec`; a config that cannot be run raises `ConfigError` (the job is reported as failure
without running)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """job_agent_config cannot be run; the job is reported as failure without running."""


@dataclass(frozen=True)
class JobSpec:
    command: list[str]
    env: dict[str, str]
    timeout_seconds: float | None


def parse_config(config: Any) -> JobSpec:
    """Validate `{"command": [str, ...], "env": {str: str}, "timeout_seconds": N}`."""
    if not isinstance(config, dict):
        raise ConfigError("job_agent_config must be an object")
    command = config.get("command")
    if (not isinstance(command, list) or not command
            or not all(isinstance(a, str) for a in command) or not command[0]):
        raise ConfigError("job_agent_config.command must be a non-empty list of strings")
    env = config.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env.items()
    ):
        raise ConfigError("job_agent_config.env must map variable names to strings")
    timeout = config.get("timeout_seconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise ConfigError("job_agent_config.timeout_seconds must be a positive number")
    return JobSpec(command=list(command), env=dict(env),
                   timeout_seconds=float(timeout) if timeout is not None else None)
