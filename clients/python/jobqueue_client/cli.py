"""`jobqueue-agent`: the reference pull agent.

    jobqueue-agent --server URL --workspace ID --agent ID --token TOKEN
                   [--concurrency N] [--drain-timeout S] [--kill-grace S] [--idle-max S]
                   [--wait-seconds S] [--log-level L]
    jobqueue-agent --config FILE [options]
    jobqueue-agent register --server URL --registration-token T --name N [--label L ...]
                   --config FILE
    jobqueue-agent --version

`register` creates the job agent with a registration token and writes FILE (JSON, mode
0600): the server, workspace, agent and token to run with. `--config FILE` runs with it;
options given on the command line or in the environment win over the file's. When the file's
token expires, the agent rotates it at 75 % of its lifetime and rewrites the file atomically
(jobqueue_client/rotation.py); the token is never logged.

Every option can also come from the environment (JOBQUEUE_SERVER, JOBQUEUE_WORKSPACE,
JOBQUEUE_AGENT, JOBQUEUE_TOKEN, JOBQUEUE_CONCURRENCY, JOBQUEUE_DRAIN_TIMEOUT,
JOBQUEUE_KILL_GRACE, JOBQUEUE_IDLE_MAX, JOBQUEUE_WAIT_SECONDS, JOBQUEUE_LOG_LEVEL,
JOBQUEUE_CONFIG, JOBQUEUE_REGISTRATION_TOKEN); prefer JOBQUEUE_TOKEN over --token (and
JOBQUEUE_REGISTRATION_TOKEN over --registration-token), which other users of the machine can
see in the process list.

Idle, the agent long-polls: each claim asks the server to hold it up to --wait-seconds (50)
until a job comes, and asks again at once when a wait ends empty. Against a server without
long-poll (an empty answer that comes early) it backs off up to --idle-max between claims.

SIGTERM or SIGINT: abort a held claim, stop claiming, let running jobs finish within the
drain timeout, release what is left, exit 0. A second signal ends the drain at once.
Exit status: 0 after a clean stop, 1 when the server refuses the agent's credentials or ids,
2 for bad options.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys

from . import agentconfig
from .client import AgentClient, register
from .errors import ApiError, TransportError
from .rotation import TokenRotator
from .runner import Agent, AgentOptions
from .version import __version__

ENV = {
    "server": "JOBQUEUE_SERVER",
    "workspace": "JOBQUEUE_WORKSPACE",
    "agent": "JOBQUEUE_AGENT",
    "token": "JOBQUEUE_TOKEN",
    "concurrency": "JOBQUEUE_CONCURRENCY",
    "drain_timeout": "JOBQUEUE_DRAIN_TIMEOUT",
    "kill_grace": "JOBQUEUE_KILL_GRACE",
    "idle_max": "JOBQUEUE_IDLE_MAX",
    "wait_seconds": "JOBQUEUE_WAIT_SECONDS",
    "log_level": "JOBQUEUE_LOG_LEVEL",
    "log_interval": "JOBQUEUE_LOG_INTERVAL",
    "config": "JOBQUEUE_CONFIG",
    "registration_token": "JOBQUEUE_REGISTRATION_TOKEN",
}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):  # inf, nan: no wait or interval is that
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="jobqueue-agent",
        description="Claim jobs from a jobqueue server, run each job's command, report back.",
        epilog="Every option can also be set in the environment variable shown in brackets.",
    )
    parser.add_argument("--server", default=env.get(ENV["server"]),
                        help="base URL of the service, e.g. http://127.0.0.1:8000 "
                             "[JOBQUEUE_SERVER]")
    parser.add_argument("--workspace", default=env.get(ENV["workspace"]),
                        help="workspace id [JOBQUEUE_WORKSPACE]")
    parser.add_argument("--agent", default=env.get(ENV["agent"]),
                        help="job agent id [JOBQUEUE_AGENT]")
    parser.add_argument("--token", default=env.get(ENV["token"]),
                        help="the job agent's token, jqa_... [JOBQUEUE_TOKEN] "
                             "(prefer the variable: arguments show in the process list)")
    parser.add_argument("--config", default=env.get(ENV["config"]), metavar="FILE",
                        help="the config file `jobqueue-agent register` wrote: server, "
                             "workspace, agent and token (the options above win over it); "
                             "its token is rotated before it expires [JOBQUEUE_CONFIG]")
    parser.add_argument("--concurrency", type=_positive_int,
                        default=env.get(ENV["concurrency"], "1"),
                        help="jobs run at once (default 1) [JOBQUEUE_CONCURRENCY]")
    parser.add_argument("--drain-timeout", type=_non_negative_float,
                        default=env.get(ENV["drain_timeout"], "30"),
                        help="on SIGTERM/SIGINT, seconds to let running jobs finish before "
                             "stopping and releasing them (default 30) [JOBQUEUE_DRAIN_TIMEOUT]")
    parser.add_argument("--kill-grace", type=_non_negative_float,
                        default=env.get(ENV["kill_grace"], "5"),
                        help="seconds between SIGTERM and SIGKILL when a job must stop "
                             "(default 5) [JOBQUEUE_KILL_GRACE]")
    parser.add_argument("--idle-max", type=_non_negative_float,
                        default=env.get(ENV["idle_max"], "5"),
                        help="longest pause between claim attempts while no job is due; the "
                             "pause grows with jitter from 0.2 s up to this (default 5) "
                             "[JOBQUEUE_IDLE_MAX]")
    parser.add_argument("--wait-seconds", type=_non_negative_int,
                        default=env.get(ENV["wait_seconds"], "50"),
                        help="long-poll: how long the server may hold each claim while nothing "
                             "is claimable (default 50, the server's default maximum; a server "
                             "with a lower one is asked for less; 0: poll with --idle-max "
                             "backoff) [JOBQUEUE_WAIT_SECONDS]")
    parser.add_argument("--log-interval", type=_positive_float,
                        default=env.get(ENV["log_interval"], "3"),
                        help="seconds between two sends of the job's output to its log on "
                             "the server (default 3; and at the end) [JOBQUEUE_LOG_INTERVAL]")
    parser.add_argument("--log-level", default=env.get(ENV["log_level"], "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="default INFO [JOBQUEUE_LOG_LEVEL]")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__}",
                        help="print the version of the agent (jobqueue-client) and exit")
    return parser


def build_register_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="jobqueue-agent register",
        description="Create this job agent with a registration token and write its config "
                    "file, which `jobqueue-agent --config FILE` runs with.",
        epilog="Exit status: 0 registered, 1 refused by the server or unreachable, 2 bad "
               "options.")
    parser.add_argument("--server", default=env.get(ENV["server"]),
                        help="base URL of the service [JOBQUEUE_SERVER]")
    parser.add_argument("--registration-token", default=env.get(ENV["registration_token"]),
                        help="jqr_... [JOBQUEUE_REGISTRATION_TOKEN] (prefer the variable)")
    parser.add_argument("--name", required=True, help="the agent's name, unique in its "
                                                      "workspace")
    parser.add_argument("--label", action="append", dest="labels", metavar="LABEL",
                        help="a label of the agent (repeat for several; none: the "
                             "registration token's)")
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="where to write the config (JSON, mode 0600)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing config file (its agent keeps existing)")
    return parser


def register_main(argv: list[str]) -> int:
    parser = build_register_parser()
    args = parser.parse_args(argv)
    if not args.server or not args.registration_token:
        parser.error("missing --server (JOBQUEUE_SERVER) or --registration-token "
                     "(JOBQUEUE_REGISTRATION_TOKEN)")
    if not args.server.startswith(("http://", "https://")):
        parser.error("--server must be an http:// or https:// URL")
    if os.path.exists(args.config) and not args.force:
        parser.error(f"{args.config} exists: pass --force to replace it")
    try:  # before registering: the token is shown once
        agentconfig.check_writable(args.config)
    except OSError as exc:
        parser.error(f"cannot write {args.config}: {exc.strerror or type(exc).__name__}")
    try:
        body, date = register(args.server, args.registration_token, args.name, args.labels)
    except TransportError as exc:
        print(f"jobqueue-agent register: the server cannot be reached: {exc}", file=sys.stderr)
        return 1
    except ApiError as exc:
        print(f"jobqueue-agent register: refused: {exc.status} {exc.code}: {exc.detail}",
              file=sys.stderr)
        return 1
    agent = body["job_agent"]
    config = agentconfig.AgentConfig(
        server=args.server.rstrip("/"), workspace=str(body["workspace_id"]),
        agent=str(agent["id"]), token="", name=agent["name"],
        labels=tuple(agent.get("labels") or ()), settings=dict(body.get("settings") or {}),
    ).with_token(body["token"], body.get("token_expires_at"), date)
    agentconfig.save(args.config, config)
    print(f"registered job agent {agent['id']} ({agent['name']}) in workspace "
          f"{body['workspace_id']}; config written to {args.config}")
    return 0


def not_dumpable() -> bool:
    """Make this process non-dumpable (Linux `prctl(PR_SET_DUMPABLE, 0)`): its
    /proc/<pid>/environ (the token, when it came from the environment), memory and ptrace
    are then closed to the jobs' children, which run as the same user but are dumpable again
    once they exec. False where the system has no prctl (nothing else changes)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    except (OSError, AttributeError):  # pragma: no cover -- not Linux
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["register"]:
        return register_main(argv[1:])
    not_dumpable()
    parser = build_parser()
    args = parser.parse_args(argv)
    config = None
    if args.config:
        try:
            config = agentconfig.load(args.config)
        except agentconfig.ConfigError as exc:
            parser.error(str(exc))
        agentconfig.remove_temporaries(args.config)
        for name in ("server", "workspace", "agent", "token"):
            if not getattr(args, name):
                setattr(args, name, getattr(config, name))
    missing = [f"--{name} ({ENV[name]})" for name in ("server", "workspace", "agent", "token")
               if not getattr(args, name)]
    if missing:
        parser.error("missing " + ", ".join(missing))
    if not args.server.startswith(("http://", "https://")):
        parser.error("--server must be an http:// or https:// URL")

    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s jobqueue-agent %(message)s",
        stream=sys.stderr,
    )
    # httpx logs every request at INFO; the agent logs its own events instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)

    # The handlers go in before anything slow (the HTTP client loads its TLS context): a
    # SIGTERM that arrives while the agent starts is a clean stop too, never the default
    # action. The agent logs `event=started` once its claim loop runs.
    signals: list[int] = []  # every signal so far
    early: list[int] = []  # those that came before the agent existed
    holder: dict[str, Agent] = {}

    def on_signal(signum, frame):
        logging.getLogger("jobqueue.agent").info(
            "event=signal name=%s action=%s", signal.Signals(signum).name,
            "abort_drain" if signals else "drain")
        signals.append(signum)
        if "agent" in holder:
            holder["agent"].request_stop()
        else:
            early.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    client = AgentClient(args.server, args.workspace, args.agent, args.token)
    agent = holder["agent"] = Agent(client, AgentOptions(
        concurrency=args.concurrency,
        drain_timeout=args.drain_timeout,
        kill_grace=args.kill_grace,
        idle_min=min(0.2, args.idle_max) or 0.05,
        idle_max=max(args.idle_max, 0.05),
        wait_seconds=args.wait_seconds,
        log_interval=args.log_interval,
    ))
    for _ in early:
        agent.request_stop()
    # The file's token is rotated before it expires (a token given as an option is not).
    rotator = None
    if config is not None and args.token == config.token:
        rotator = TokenRotator(client, args.config, config).start()
    try:
        return agent.run()
    finally:
        if rotator is not None:
            rotator.stop()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
