"""`jobqueue`: the producer's command line, on ProducerClient (needs only httpx).

    jobqueue [--url URL] [--workspace ID] [--api-key KEY] [--json] COMMAND ...
    jobqueue jobs create --agent ID | --label L [--label L ...]
                         [--config FILE|-|JSON] [--context FILE|-] [options]
                         [--wait [--timeout S]] [-- COMMAND ...]
    jobqueue jobs get|wait|explain|cancel|requeue|dispatch ID
    jobqueue jobs list [--status S] [--group G] [--agent ID] [--limit N | --all]
    jobqueue jobs logs ID [--attempt N] [--follow]
    jobqueue jobs artifacts ID [--download DIR [--name NAME ...]]
    jobqueue groups get|cancel NAME
    jobqueue flows create FILE|-
    jobqueue schedules create|list|get|pause|resume|trigger|delete ...
    jobqueue rate-limits set KEY --count N --period-seconds S
    jobqueue rate-limits get|delete KEY
    jobqueue rate-limits list [--limit N | --all]
    jobqueue fairness-keys set KEY --weight N
    jobqueue fairness-keys get|delete KEY
    jobqueue fairness-keys list [--limit N | --all]

The connection comes from JOBQUEUE_URL (else JOBQUEUE_SERVER, the agent's name for it),
JOBQUEUE_WORKSPACE and JOBQUEUE_API_KEY, or from --url, --workspace and --api-key (which may
be given before or after the command). `--json` prints one JSON document on stdout. The exit
statuses are in cli_output.py and docs/cli.md.

Here: the arguments (`build_parser`), the settings and `main`, which turns every error into its
message and exit status. What each command does is in producer_commands.py; what it prints, in
cli_output.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import os
import sys
from dataclasses import dataclass

from .cli import _non_negative_float, _non_negative_int, _positive_float, _positive_int
from .cli_output import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CommandFailed,
    Output,
    UsageError,
    exit_code_of,
    explain,
)
from .errors import ApiError
from .producer import ProducerClient
from .producer_commands import (
    cmd_artifacts,
    cmd_cancel,
    cmd_create,
    cmd_dispatch,
    cmd_explain,
    cmd_fairness_delete,
    cmd_fairness_get,
    cmd_fairness_list,
    cmd_fairness_set,
    cmd_flow_create,
    cmd_get,
    cmd_group_cancel,
    cmd_group_get,
    cmd_list,
    cmd_logs,
    cmd_rate_limit_delete,
    cmd_rate_limit_get,
    cmd_rate_limit_list,
    cmd_rate_limit_set,
    cmd_requeue,
    cmd_schedule_create,
    cmd_schedule_delete,
    cmd_schedule_get,
    cmd_schedule_list,
    cmd_schedule_pause,
    cmd_schedule_resume,
    cmd_schedule_trigger,
    cmd_wait,
)

STATUSES = ["pending", "queued", "in_progress", "successful", "failure", "cancelled", "expired"]
DEFAULT_LIST_LIMIT = 100

EXIT_STATUS_HELP = """\
exit status:
  0  done (with --wait, `jobs wait`, `jobs logs --follow`: the job ended successful)
  1  the job ended, but not successful (failure, cancelled, expired)
  2  usage: a bad option or argument, a missing setting, or a field the server refused
  3  not found: no such job, group, artifact, schedule or rate limit in the workspace
  4  the API key was refused, or may not do this
  5  no answer from the server, a server error, or throttled
  6  conflict: the job's or group's state does not allow it
  7  --timeout passed before the job ended
  130 interrupted (Ctrl-C); a job being waited for goes on

settings: JOBQUEUE_URL (else JOBQUEUE_SERVER), JOBQUEUE_WORKSPACE, JOBQUEUE_API_KEY,
or --url, --workspace, --api-key. Details: docs/cli.md."""


def version() -> str:
    try:
        return importlib.metadata.version("jobqueue-client")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (a bad option value, a missing argument) are one
    JSON object on stderr when the command line asks for --json, as every other error is.
    Its subcommands' parsers are of this class too (argparse makes them of the parent's)."""

    machine = False  # set by main() from the command line, before parsing

    def error(self, message):
        if _Parser.machine:
            Output(machine=True).error(f"{message} (see {self.prog} --help)", code="usage",
                                       exit_code=EXIT_USAGE)
            sys.exit(EXIT_USAGE)
        super().error(message)


class _Formatter(argparse.HelpFormatter):
    """Wraps descriptions as usual, but keeps a text with line breaks (the exit statuses)
    as it is written."""

    def _fill_text(self, text, width, indent):
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


@dataclass(frozen=True)
class Settings:
    url: str
    workspace: str
    api_key: str


# --- arguments -----------------------------------------------------------------------------


def _connection_options(default) -> argparse.ArgumentParser:
    """--url, --workspace, --api-key, --json: on the top parser (default None) and on every
    command (default SUPPRESS: a value given after the command wins, none keeps the top's)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("connection and output")
    group.add_argument("--url", default=default, metavar="URL",
                       help="the service's base URL, e.g. http://127.0.0.1:8000 "
                            "[JOBQUEUE_URL, else JOBQUEUE_SERVER]")
    group.add_argument("--workspace", default=default, metavar="ID",
                       help="the workspace id [JOBQUEUE_WORKSPACE]")
    group.add_argument("--api-key", default=default, metavar="KEY",
                       help="the workspace API key, jqk_… [JOBQUEUE_API_KEY] (prefer the "
                            "variable: arguments show in the process list)")
    group.add_argument("--json", action="store_true",
                       default=False if default is None else default,
                       help="machine output: one JSON document on stdout (errors: a JSON "
                            "object on stderr)")
    return parent


def _expires_at(text: str) -> str:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (e.g. 2030-01-02T03:04:05Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.isoformat()


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


UNIQUE_STATES = ("pending", "queued", "in_progress")


def _ids(text: str) -> list[str]:
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise argparse.ArgumentTypeError("give at least one job id")
    return ids


def _unique_states(text: str) -> list[str]:
    states = [s.strip() for s in text.split(",")]
    if not all(s in UNIQUE_STATES for s in states):
        raise argparse.ArgumentTypeError(
            "a comma-separated list of: " + ", ".join(UNIQUE_STATES))
    return states


def build_parser() -> argparse.ArgumentParser:
    common = _connection_options(argparse.SUPPRESS)
    parser = _Parser(
        prog="jobqueue", parents=[_connection_options(None)],
        formatter_class=_Formatter,
        description="Create jobs on a jobqueue server, follow them and collect what they "
                    "leave (the producer's side of the API, with a workspace API key).",
        epilog=EXIT_STATUS_HELP,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the version (of jobqueue-client) and exit")
    nouns = parser.add_subparsers(dest="noun",
                                  metavar="{jobs,groups,schedules,flows,rate-limits,"
                                          "fairness-keys}",
                                  required=True)

    def command(group, name, handler, help_, *, description=None):
        sub = group.add_parser(name, parents=[common], help=help_,
                               description=description or help_[:1].upper() + help_[1:] + ".",
                               epilog=EXIT_STATUS_HELP,
                               formatter_class=_Formatter)
        sub.set_defaults(handler=handler)
        return sub

    jobs = nouns.add_parser("jobs", help="create, inspect, wait for, cancel, requeue jobs; "
                                         "read their logs and artifacts",
                            description="Jobs: one command per action.")
    verbs = jobs.add_subparsers(dest="verb", required=True,
                                metavar="{create,get,wait,explain,list,cancel,requeue,"
                                        "dispatch,logs,artifacts}")

    create = command(verbs, "create", cmd_create,
                     "create a job for a job agent, or for the agents with some labels",
                     description="Create a job for a job agent (--agent), or for any job agent "
                                 "whose labels include all of the job's (--label; queued; "
                                 "pending with --hold). Prints the job; with --wait, waits for "
                                 "its end and prints it then.")
    target = create.add_mutually_exclusive_group()
    target.add_argument("--agent", metavar="ID", default=os.environ.get("JOBQUEUE_AGENT"),
                        help="the id of the job agent that runs the job [JOBQUEUE_AGENT]")
    target.add_argument("--label", action="append", metavar="LABEL",
                        help="instead of --agent: a label the agent that runs the job must "
                             "have (repeatable: 1 to 16, the agent has them all)")
    create.add_argument("--config", metavar="FILE|-|JSON",
                        help="the job's job_agent_config, a JSON object: a file, - for stdin, "
                             "or the object itself ('{\"command\": [\"make\"]}')")
    create.add_argument("--context", metavar="FILE|-",
                        help="the job's dispatch_context, a JSON object, from a file or - for "
                             "stdin (it may hold secrets: only the claiming agent sees it, so "
                             "it is never taken from the command line)")
    create.add_argument("--priority", type=_int, metavar="N",
                        help="higher is claimed first (default 0)")
    create.add_argument("--max-attempts", type=_positive_int, metavar="N",
                        help="claims before the job ends expired (default: the agent's)")
    create.add_argument("--delay-seconds", type=_non_negative_int, metavar="S",
                        help="not claimable before S seconds from now")
    create.add_argument("--retry-backoff-seconds", type=_non_negative_int, metavar="S",
                        help="the wait before the first retry of a retryable failure, doubled "
                             "per attempt (default: the server's)")
    create.add_argument("--max-runtime-seconds", type=_positive_int, metavar="S",
                        help="how long one attempt may run from its claim (default: the "
                             "agent's)")
    create.add_argument("--expires-at", type=_expires_at, metavar="TIME",
                        help="ISO 8601 time by which the whole job must be finished (naive: "
                             "UTC); past it the job ends expired")
    create.add_argument("--external-id", metavar="TEXT",
                        help="your own reference for the job (up to 255 characters)")
    create.add_argument("--group", metavar="NAME",
                        help="the group (run) the job belongs to: 1-200 characters, no /")
    create.add_argument("--hold", action="store_true",
                        help="create it pending: `jobqueue jobs dispatch ID` queues it")
    create.add_argument("--idempotency-key", metavar="KEY",
                        help="makes the create safe to repeat: the same key and fields answer "
                             "the first job (and a lost answer is sent again)")
    create.add_argument("--unique-key", metavar="KEY",
                        help="while a job of the workspace with KEY is pending, queued or in "
                             "progress, answer it instead of creating another (1-255 "
                             "characters)")
    create.add_argument("--unique-states", type=_unique_states, metavar="S[,S]",
                        help="with --unique-key: which of pending, queued, in_progress count "
                             "(default: all three)")
    create.add_argument("--on-conflict", choices=["skip", "replace"],
                        help="with --unique-key: skip (default) answers the live job as it is; "
                             "replace updates one not yet claimed (context, priority, start) "
                             "and creates a new job beside a running one")
    create.add_argument("--debounce-seconds", type=_positive_int, metavar="S",
                        help="with --unique-key: start the job S seconds after the last create "
                             "that meets it queued (which also gives it its context)")
    create.add_argument("--debounce-max-seconds", type=_positive_int, metavar="S",
                        help="with --debounce-seconds: push no later than S seconds after the "
                             "job's first create (the cap that create gave the job holds, "
                             "whatever later creates send)")
    create.add_argument("--concurrency-key", metavar="KEY",
                        help="claim the job only while fewer than --concurrency-limit jobs of "
                             "the workspace with KEY are in progress (1-255 characters)")
    create.add_argument("--concurrency-limit", type=_positive_int, metavar="N",
                        help="with --concurrency-key: how many of its jobs may run at once "
                             "(1-1000, default 1)")
    create.add_argument("--rate-limit-key", metavar="KEY",
                        help="claim the job only while KEY's rate limit (`jobqueue rate-limits "
                             "set KEY`), if it has one, lets a claim through (1-255 "
                             "characters)")
    create.add_argument("--fairness-key", metavar="KEY",
                        help="share claims among the jobs' fairness keys (e.g. tenants) in "
                             "proportion to their weights (`jobqueue fairness-keys set KEY`; "
                             "1 without one), whatever number each has queued (1-255 "
                             "characters)")
    create.add_argument("--depends-on", type=_ids, metavar="ID[,ID]",
                        help="wait (pending) until these jobs of the workspace are all "
                             "successful (1 to 100); cancelled if one ends otherwise")
    create.add_argument("--wait", action="store_true",
                        help="wait until the job ends; exit 0 if successful, 1 if not")
    create.add_argument("--timeout", type=_non_negative_float, metavar="S",
                        help="with --wait: give up after S seconds (exit 7; the job goes on)")
    create.add_argument("-q", "--quiet", action="store_true",
                        help="print only the job's id (without --json)")
    create.add_argument("command", nargs="*", metavar="-- COMMAND",
                        help="the command the job runs (after --), put in the config as "
                             "\"command\" (the reference agent runs it), e.g. -- make deploy")

    get = command(verbs, "get", cmd_get, "show a job: status, attempts, result")
    get.add_argument("id", metavar="ID", help="the job's id")
    get.add_argument("--events", action="store_true", help="also print the job's timeline")

    wait = command(verbs, "wait", cmd_wait,
                   "wait until a job ends and show it; exit 0 if successful, 1 if not",
                   description="Wait until a job ends (long-polling the server) and show it. "
                               "Exit 0 when it ended successful, 1 when it ended otherwise.")
    wait.add_argument("id", metavar="ID", help="the job's id")
    wait.add_argument("--timeout", type=_non_negative_float, metavar="S",
                      help="give up after S seconds (exit 7; the job goes on); default: wait "
                           "as long as it takes")
    wait.add_argument("--events", action="store_true", help="also print the job's timeline")

    explain_ = command(verbs, "explain", cmd_explain,
                       "say why a job is not running, or that the next claim takes it",
                       description="Why a job is not running, from the rule claims use: its "
                                   "status, whether a claim of a matching agent would take it "
                                   "now, each reason (code and detail), and how many agents "
                                   "match it and are online.")
    explain_.add_argument("id", metavar="ID", help="the job's id")

    list_ = command(verbs, "list", cmd_list, "list jobs, newest first",
                    description="List jobs, newest first, following the pages. Items are "
                                "summaries: `jobqueue jobs get ID` has the rest.")
    list_.add_argument("--status", choices=STATUSES, help="only jobs in this status")
    list_.add_argument("--group", metavar="NAME", help="only the jobs of this group")
    list_.add_argument("--agent", metavar="ID", help="only the jobs of this job agent")
    many = list_.add_mutually_exclusive_group()
    many.add_argument("--limit", type=_positive_int, metavar="N", default=DEFAULT_LIST_LIMIT,
                      help=f"at most N jobs (default {DEFAULT_LIST_LIMIT})")
    many.add_argument("--all", action="store_true", help="every matching job")

    for name, handler, help_ in (
            ("cancel", cmd_cancel, "cancel a job, even while an agent runs it"),
            ("requeue", cmd_requeue, "queue a job again, with as many further attempts as "
                                     "it was created with")):
        sub = command(verbs, name, handler, help_)
        sub.add_argument("id", metavar="ID", help="the job's id")
        sub.add_argument("--reason", metavar="TEXT",
                         help="why (up to 500 characters; kept on the job's timeline)")

    dispatch = command(verbs, "dispatch", cmd_dispatch,
                       "queue a job created with --hold (pending)")
    dispatch.add_argument("id", metavar="ID", help="the job's id")

    logs = command(verbs, "logs", cmd_logs, "print a job's log",
                   description="Print a job's log (the latest attempt's, or --attempt N's). "
                               "With --follow, print it as it grows until the job ends, "
                               "then exit as `jobqueue jobs wait` does.")
    logs.add_argument("id", metavar="ID", help="the job's id")
    logs.add_argument("--attempt", type=_positive_int, metavar="N",
                      help="this attempt's log (default: the latest attempt's, following "
                           "later attempts with --follow)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing as the log grows; stop when the job ends")
    logs.add_argument("--interval", type=_positive_float, metavar="S", default=2.0,
                      help="with --follow: the longest pause between two reads (default 2; "
                           "the job's end is seen at once)")

    artifacts = command(verbs, "artifacts", cmd_artifacts,
                        "list a job's published artifacts, or download them",
                        description="List the artifacts a job published (its successful "
                                    "attempt's files), or download them with --download.")
    artifacts.add_argument("id", metavar="ID", help="the job's id")
    artifacts.add_argument("--download", metavar="DIR",
                           help="save every artifact (or those named with --name) into DIR "
                                "(made if missing; a file of the same name is replaced), each "
                                "checked against its sha256")
    artifacts.add_argument("--name", action="append", metavar="NAME",
                           help="with --download: only this artifact (repeatable)")

    groups = nouns.add_parser("groups", help="look at or cancel a group of jobs (a run)",
                              description="Groups: the jobs created with the same --group.")
    gverbs = groups.add_subparsers(dest="verb", required=True, metavar="{get,cancel}")
    gget = command(gverbs, "get", cmd_group_get,
                   "show a group: its jobs by status, finished or not")
    gget.add_argument("name", metavar="NAME", help="the group's name")
    gcancel = command(gverbs, "cancel", cmd_group_cancel,
                      "cancel every live job of a group; the group takes no new jobs")
    gcancel.add_argument("name", metavar="NAME", help="the group's name")

    flows = nouns.add_parser("flows", help="create a graph of jobs at once",
                             description="Flows: jobs that depend on earlier ones.")
    fverbs = flows.add_subparsers(dest="verb", required=True, metavar="{create}")
    fcreate = command(fverbs, "create", cmd_flow_create,
                      "create a flow: every job of a JSON file at once, all or nothing",
                      description='Create every job of FILE ({"jobs": [{"ref": "extract", '
                                  '"job_agent_id": ID, …}, {"ref": "load", …, '
                                  '"depends_on_refs": ["extract"]}]}) in one transaction. '
                                  "Prints each job's ref, id and status.")
    fcreate.add_argument("file", metavar="FILE|-", help="the flow, a JSON object (- for stdin)")
    gcancel.add_argument("--reason", metavar="TEXT",
                         help="why (up to 500 characters; kept on each job's timeline)")
    _schedule_commands(nouns, command)
    _rate_limit_commands(nouns, command)
    _fairness_commands(nouns, command)
    return parser


def _fairness_commands(nouns, command) -> None:
    keys = nouns.add_parser(
        "fairness-keys", help="fair shares: the weights of the --fairness-key values",
        description="Fair shares: the claims of the jobs created with --fairness-key are "
                    "shared among the keys in proportion to their weights (1 to 100; a key "
                    "without one weighs 1), whatever number of jobs each has queued.")
    verbs = keys.add_subparsers(dest="verb", required=True, metavar="{set,get,delete,list}")
    set_ = command(verbs, "set", cmd_fairness_set,
                   "set a fairness key's weight (created or replaced)",
                   description="Set KEY's weight, created or replaced: its jobs' share of "
                               "claims against the other keys' weights. Prints the weight.")
    set_.add_argument("key", metavar="KEY",
                      help="the fairness key (1-255 printable characters; a / or a space is "
                           "fine)")
    set_.add_argument("--weight", required=True, type=_positive_int, metavar="N",
                      help="the key's weight (1-100)")
    for name, handler, help_ in (
            ("get", cmd_fairness_get, "show a fairness key's weight"),
            ("delete", cmd_fairness_delete, "remove a fairness key's weight: it weighs 1 "
                                            "again")):
        sub = command(verbs, name, handler, help_)
        sub.add_argument("key", metavar="KEY", help="the fairness key")
    list_ = command(verbs, "list", cmd_fairness_list, "list the fairness keys' weights, by key")
    many = list_.add_mutually_exclusive_group()
    many.add_argument("--limit", type=_positive_int, metavar="N", default=DEFAULT_LIST_LIMIT,
                      help=f"at most N weights (default {DEFAULT_LIST_LIMIT})")
    many.add_argument("--all", action="store_true", help="every weight")


def _rate_limit_commands(nouns, command) -> None:
    limits = nouns.add_parser(
        "rate-limits", help="rate limits: how many jobs of a --rate-limit-key may be claimed "
                            "in a period",
        description="Rate limits: the jobs created with --rate-limit-key KEY are claimed only "
                    "while fewer than the key's count of them were claimed in the last "
                    "period; a key without a limit limits nothing.")
    verbs = limits.add_subparsers(dest="verb", required=True, metavar="{set,get,delete,list}")
    set_ = command(verbs, "set", cmd_rate_limit_set,
                   "set a key's rate limit (created or replaced)",
                   description="Set KEY's rate limit, created or replaced: its jobs are claimed "
                               "only while fewer than --count of them were claimed in the "
                               "last --period-seconds. Prints the limit.")
    set_.add_argument("key", metavar="KEY",
                      help="the rate limit key (1-255 printable characters; a / or a space "
                           "is fine)")
    set_.add_argument("--count", required=True, type=_positive_int, metavar="N",
                      help="how many of the key's jobs may be claimed per period (1-100000)")
    set_.add_argument("--period-seconds", required=True, type=_positive_int, metavar="S",
                      help="the sliding window, in seconds (1-86400)")
    for name, handler, help_ in (
            ("get", cmd_rate_limit_get, "show a key's rate limit"),
            ("delete", cmd_rate_limit_delete, "remove a key's rate limit: its jobs are no "
                                              "longer held back by it")):
        sub = command(verbs, name, handler, help_)
        sub.add_argument("key", metavar="KEY", help="the rate limit key")
    list_ = command(verbs, "list", cmd_rate_limit_list, "list the rate limits, by key")
    many = list_.add_mutually_exclusive_group()
    many.add_argument("--limit", type=_positive_int, metavar="N", default=DEFAULT_LIST_LIMIT,
                      help=f"at most N rate limits (default {DEFAULT_LIST_LIMIT})")
    many.add_argument("--all", action="store_true", help="every rate limit")


def _schedule_commands(nouns, command) -> None:
    schedules = nouns.add_parser(
        "schedules", help="cron schedules: the server creates their jobs at each fire time",
        description="Schedules: maintenance creates the schedule's job at each fire time of "
                    "its cron, in its time zone.")
    verbs = schedules.add_subparsers(
        dest="verb", required=True,
        metavar="{create,list,get,pause,resume,trigger,delete}")
    create = command(verbs, "create", cmd_schedule_create,
                     "create a cron schedule of jobs for a job agent",
                     description="Create a cron schedule: at each fire time the server "
                                 "creates the job these options describe. Prints the schedule "
                                 "with its next fire times.")
    create.add_argument("--name", required=True, metavar="NAME",
                        help="the schedule's name (unique in the workspace)")
    create.add_argument("--cron", required=True, metavar="EXPR",
                        help='five fields, minute hour day-of-month month day-of-week, e.g. '
                             '"30 2 * * *"')
    create.add_argument("--timezone", metavar="TZ",
                        help="the IANA time zone of the cron, e.g. Europe/Berlin (default UTC)")
    create.add_argument("--overlap", choices=["skip", "buffer_one", "allow"],
                        help="skip (default): no job while the previous one is live; "
                             "buffer_one: no job while one waits unclaimed; allow: always")
    create.add_argument("--catchup-window-seconds", type=_non_negative_int, metavar="S",
                        help="make up a fire time missed while maintenance was down if it is "
                             "at most S seconds late (default 60; at most 604800)")
    create.add_argument("--paused", action="store_true", help="create it paused")
    create.add_argument("--agent", metavar="ID", default=os.environ.get("JOBQUEUE_AGENT"),
                        help="the id of the job agent that runs its jobs [JOBQUEUE_AGENT]")
    create.add_argument("--config", metavar="FILE|-|JSON",
                        help="the jobs' job_agent_config, a JSON object: a file, - for stdin, "
                             "or the object itself")
    create.add_argument("--context", metavar="FILE|-",
                        help="the jobs' dispatch_context, a JSON object, from a file or - for "
                             "stdin (never from the command line: it may hold secrets)")
    create.add_argument("--priority", type=_int, metavar="N", help="the jobs' priority")
    create.add_argument("--max-attempts", type=_positive_int, metavar="N",
                        help="the jobs' attempts (default: the agent's)")
    create.add_argument("--max-runtime-seconds", type=_positive_int, metavar="S",
                        help="how long one attempt of a job may run")
    create.add_argument("--group", metavar="NAME", help="the group the jobs join")
    create.add_argument("--unique-key", metavar="KEY",
                        help="the jobs' unique key: no job while one with KEY is live")
    create.add_argument("-q", "--quiet", action="store_true",
                        help="print only the schedule's id (without --json)")
    create.add_argument("command", nargs="*", metavar="-- COMMAND",
                        help="the command the jobs run (after --), put in the config as "
                             "\"command\"")

    list_ = command(verbs, "list", cmd_schedule_list, "list schedules, newest first")
    many = list_.add_mutually_exclusive_group()
    many.add_argument("--limit", type=_positive_int, metavar="N", default=DEFAULT_LIST_LIMIT,
                      help=f"at most N schedules (default {DEFAULT_LIST_LIMIT})")
    many.add_argument("--all", action="store_true", help="every schedule")
    for name, handler, help_ in (
            ("get", cmd_schedule_get, "show a schedule: its next fire times, its last fire"),
            ("pause", cmd_schedule_pause, "pause a schedule: it fires nothing until resumed"),
            ("resume", cmd_schedule_resume, "resume a schedule, from its next fire time after "
                                            "now"),
            ("trigger", cmd_schedule_trigger, "fire a schedule now (paused or not) and print "
                                              "its job"),
            ("delete", cmd_schedule_delete, "delete a schedule (its jobs stay)")):
        sub = command(verbs, name, handler, help_)
        sub.add_argument("id", metavar="ID", help="the schedule's id")


def settings_from(args: argparse.Namespace, env=os.environ) -> Settings:
    url = args.url or env.get("JOBQUEUE_URL") or env.get("JOBQUEUE_SERVER")
    missing = [text for value, text in (
        (url, "JOBQUEUE_URL (or --url): the service's base URL, e.g. http://127.0.0.1:8000"),
        (args.workspace or env.get("JOBQUEUE_WORKSPACE"),
         "JOBQUEUE_WORKSPACE (or --workspace): the workspace id"),
        (args.api_key or env.get("JOBQUEUE_API_KEY"),
         "JOBQUEUE_API_KEY (or --api-key): the workspace API key, jqk_…"),
    ) if not value]
    if missing:
        raise UsageError("set " + "; ".join(missing))
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"JOBQUEUE_URL (or --url) must be an http:// or https:// URL, not "
                         f"{url!r}")
    return Settings(url, args.workspace or env["JOBQUEUE_WORKSPACE"],
                    args.api_key or env["JOBQUEUE_API_KEY"])


def _subject(args) -> str:
    """What a command is about, for its error messages."""
    if getattr(args, "name", None) and args.noun == "groups":
        return f"group {args.name!r}"
    if args.noun == "schedules":
        return f"schedule {args.id}" if getattr(args, "id", None) else "the schedule"
    if args.noun == "rate-limits":
        key = getattr(args, "key", None)
        return f"the rate limit of {key!r}" if key is not None else "the rate limits"
    if args.noun == "fairness-keys":
        key = getattr(args, "key", None)
        return f"the weight of {key!r}" if key is not None else "the fairness keys"
    if getattr(args, "id", None):
        return f"job {args.id}"
    if getattr(args, "verb", None) == "create":
        return "the new job"
    return "the request"


def main(argv: list[str] | None = None, *, transport=None) -> int:
    parser = build_parser()
    _Parser.machine = "--json" in (sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    out = Output(machine=args.json)
    try:
        settings = settings_from(args)
        with ProducerClient(settings.url, settings.workspace, settings.api_key,
                            transport=transport,
                            user_agent=f"jobqueue-cli/{version()}") as client:
            return args.handler(client, args, out)
    except UsageError as exc:
        return out.error(f"{exc} (see jobqueue {args.noun} {args.verb} --help)",
                         code="usage", exit_code=EXIT_USAGE)
    except CommandFailed as exc:
        return out.error(str(exc), code=exc.code, exit_code=exc.exit_code)
    except ApiError as exc:
        return out.error(explain(exc, what=_subject(args), settings=settings), code=exc.code,
                         exit_code=exit_code_of(exc), status=exc.status or None,
                         fields=exc.fields)
    except KeyboardInterrupt:
        return out.error("interrupted", code="interrupted", exit_code=EXIT_INTERRUPTED)
    except BrokenPipeError:  # `jobqueue jobs list | head`: the reader has gone, quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
