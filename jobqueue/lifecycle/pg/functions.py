"""The hot statements' PL/pgSQL wrappers, for a server behind a transaction-mode pooler.

Without prepared statements (JOBQUEUE_PREPARED_STATEMENTS=0: PgBouncer before 1.21 in
transaction mode, Debian 12's 1.18) every claim and report was parsed and planned again: half
of the core cycle's time (docs/performance.md, "Behind PgBouncer"). A PL/pgSQL function
prepares the statements it runs once per server connection and keeps their plans there, and a
pooler keeps its server connections: a call is one short statement to plan, whichever client
the pooler lends the connection to (procrastinate's lever).

Each wrapper is generated from the statement as the backend runs it (the template
function_define, jobqueue/sql/postgresql.sql): the statement's text lives in one place. Its
%(name)s parameters become the function's, in order of first use, typed as PostgreSQL infers
them; its result columns the function's, named and typed as the statement answers them (both
read by describing the statement on the server). A wrapper's name is the statement's and the
digest of its text (`jobqueue_job_claim_by_id_1f2e3d4c`): a text changed by an upgrade is
another wrapper, and a server where the code finds no wrapper of the text it runs (an upgrade
not migrated yet) runs the statement itself, as before (cursor.py).

Installed by `migrate`: migration 0017 and then the post_migrate receiver (jobqueue/apps.py),
after every `migrate`, so a statement's new text is installed by the next `migrate` without a
migration of its own; a wrapper whose definition would now differ (a column's type changed)
is defined again. A wrapper no release calls any more is left in place (an older release
still running during a rolling upgrade may call it); the migration's reverse drops them all.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re

from jobqueue.sql import postgresql as sql

log = logging.getLogger(__name__)
_PARAM = re.compile(r"%\((\w+)\)s")
_WRAPPED = (
    "job_claim_by_id", "job_set_state_if_running", "job_fail_or_retry_if_running",
    "job_set_progress_if_running", "job_set_state_if_running_many",
    "claim_extend_if_current", "claim_extend_if_current_in_workspace",
    "claim_extend_if_current_many", "claim_extend_if_current_many_in_workspace",
)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def wrapped() -> dict[str, str]:
    """{a wrapper's name: the statement it runs}: every statement the hot cursor runs, and
    claim-next at its LIMIT 1, both forms (a batch claim of more amortizes its planning over
    the batch)."""
    from . import claim_statement

    statements = {"job_claim_available_1": claim_statement(1),
                  "job_claim_available_routed_1": claim_statement(1, True),
                  **{name: getattr(sql, name) for name in _WRAPPED}}
    return {name_of(label, text): text for label, text in statements.items()}


def name_of(label: str, statement: str) -> str:
    """The wrapper's name: the statement's and the digest of its text (and templates)."""
    made_by = "\n".join((sql.function_define, sql.function_call, statement))
    return f"jobqueue_{label}_{_digest(made_by)[:8]}"


def parameters(statement: str) -> list[str]:
    """The statement's parameter names, in order of first use."""
    return list(dict.fromkeys(_PARAM.findall(statement)))


def call(function: str, statement: str) -> str:
    """The call of a statement's wrapper, taking the statement's own parameters."""
    return sql.function_call.format(
        function=function,
        arguments=", ".join(f"%({name})s" for name in parameters(statement)))


def _positional(statement: str) -> str:
    """The statement with $1... for its %(name)s parameters (and % for %%)."""
    order = {name: i for i, name in enumerate(parameters(statement), 1)}
    return _PARAM.sub(lambda m: f"${order[m[1]]}", statement).replace("%%", "%")


def definition(cursor, function: str, statement: str) -> tuple[str, str]:
    """(the CREATE FUNCTION of a statement's wrapper, its digest): the statement described
    on the server (its parameters' and columns' types) through `cursor` (Django's or
    psycopg's, outside a failed transaction)."""
    pgconn = cursor.connection.pgconn
    text = _positional(statement)
    prepared = pgconn.prepare(b"", text.encode())
    if prepared.error_message:
        raise RuntimeError(f"{function}: {prepared.error_message.decode()}")
    described = pgconn.describe_prepared(b"")
    oids = [described.param_type(i) for i in range(described.nparams)]
    mods = [-1] * len(oids)
    names = [described.fname(i).decode() for i in range(described.nfields)]
    oids += [described.ftype(i) for i in range(described.nfields)]
    mods += [described.fmod(i) for i in range(described.nfields)]
    cursor.execute(sql.function_type_names, {"oids": oids, "mods": mods})
    types = [row[0] for row in cursor.fetchall()]
    params, columns = types[:described.nparams], types[described.nparams:]
    fields = {
        "function": function,
        "parameters": ", ".join(f"p_{name} {kind}" for name, kind
                                in zip(parameters(statement), params, strict=True)),
        "columns": ", ".join(f'"{name}" {kind}' for name, kind
                             in zip(names, columns, strict=True)),
        "statement": text,
    }
    digest = _digest(sql.function_define.format(digest="", **fields))[:16]
    return sql.function_define.format(digest=digest, **fields), digest


def installed(cursor, names) -> dict[str, str]:
    """{name: its definition's digest} of the wrappers among `names` that are installed."""
    cursor.execute(sql.function_list_installed, {"names": list(names)})
    return dict(cursor.fetchall())


def install(connection) -> list[str]:
    """Define every wrapper that is missing or whose definition would now differ, on a
    Django PostgreSQL connection, in one transaction: the names defined. A statement the
    server cannot describe yet (a `migrate` stopped before the migration that adds a column
    it names) gets no wrapper, with a warning: it runs unwrapped until the next `migrate`."""
    from django.db import DatabaseError, transaction

    defined = []
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        statements = wrapped()
        present = installed(cursor, statements)
        for function, statement in statements.items():
            try:
                with transaction.atomic(using=connection.alias):
                    create, digest = definition(cursor, function, statement)
                    if present.get(function) == digest:
                        continue
                    cursor.execute(sql.function_drop.format(function=function))
                    cursor.execute(create)
            except (DatabaseError, RuntimeError) as exc:
                log.warning("%s not installed: %s", function, str(exc).strip())
                continue
            defined.append(function)
    return defined


def drop_all(connection) -> None:
    """Drop every wrapper this code or an earlier release installed (the migration's
    reverse)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.function_list_all)
        for (function,) in cursor.fetchall():
            cursor.execute(sql.function_drop.format(function=function))
