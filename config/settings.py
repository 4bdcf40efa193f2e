"""Settings, all from the environment (django-environ).

Deployment needs at least DATABASE_URL, DJANGO_SECRET_KEY, DJANGO_ALLOWED_HOSTS and
DJANGO_DEBUG. Without DATABASE_URL the service runs on an embedded SQLite file under var/.
"""

import os
import re
import time
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from jobqueue import __version__ as jobqueue_version
from jobqueue.conf import DEFAULTS

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("JOBQUEUE_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)  # the SQLite file, static files, metrics live here

env = environ.Env(
    DJANGO_DEBUG=(bool, False),
    DJANGO_ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "[::1]", "testserver"]),
)

DEBUG = env("DJANGO_DEBUG")


def _env(cast, name: str):
    """JOBQUEUE_<name> from the environment, read by `cast` (env.int, env.float, env.str,
    env.bool); unset, jobqueue/conf.py's DEFAULTS[name], the one place a default is written."""
    return cast(f"JOBQUEUE_{name}", DEFAULTS[name])


def _local_secret_key(path: Path) -> str:
    """Without DJANGO_SECRET_KEY, a random key made once for this installation and kept in
    var/secret_key (0600), so that no two installations share a key and sessions survive
    restarts. Several processes starting at once agree on the first one written."""
    import secrets

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):
            key = path.read_text().strip()
            if key:
                return key
            time.sleep(0.02)  # another process is writing it right now
        raise
    key = secrets.token_urlsafe(50)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key


SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="") or _local_secret_key(VAR_DIR / "secret_key")
ALLOWED_HOSTS = env("DJANGO_ALLOWED_HOSTS")
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
# Served over https only (docs/deploying.md: nginx redirects http): the session and CSRF
# cookies go over https only, and browsers are told to use https (HSTS) for this long.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=False)
SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=0)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "jobqueue",
    "agents",
    "ops",
]

MIDDLEWARE = [
    # Times every request for /metrics (first, so that it sees the whole request).
    "ops.middleware.RequestMetricsMiddleware",
    # A Host not in ALLOWED_HOSTS: 400, one WARNING line (Django logs a traceback at ERROR).
    "agents.middleware.DisallowedHostMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Refuses oversized /v1/ request bodies (413) before anything reads them.
    "agents.middleware.RequestSizeLimitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # Refuses forms Django cannot read (400, one log line) before CSRF reads them.
    "agents.middleware.UnreadableFormMiddleware",
    # Logs a jobqueue-client older than JOBQUEUE_MIN_CLIENT_VERSION (once per version).
    "agents.middleware.ClientVersionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

# --- Database ---------------------------------------------------------------------------
# PostgreSQL in production (several stateless API replicas); SQLite as the embedded default.
DATABASE_URL = env.str("DATABASE_URL", default="") or f"sqlite:///{VAR_DIR / 'jobqueue.sqlite3'}"
DATABASES = {"default": env.db_url_config(DATABASE_URL)}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (API server, reaper, tests) share one file: WAL lets readers go on
    # while one writer writes, IMMEDIATE takes the write lock at BEGIN so that a
    # read-then-write transaction can never be upgraded into a deadlock, and the busy
    # timeout makes a waiting writer queue instead of failing.
    _db.setdefault("OPTIONS", {})
    _db["OPTIONS"].setdefault("transaction_mode", "IMMEDIATE")
    _db["OPTIONS"].setdefault("timeout", env.float("SQLITE_BUSY_TIMEOUT_SECONDS", 30.0))
    _db["OPTIONS"].setdefault(
        "init_command",
        # synchronous=FULL: a commit the service has answered survives a power loss too.
        "PRAGMA journal_mode=WAL;PRAGMA synchronous=FULL;PRAGMA busy_timeout="
        + str(int(env.float("SQLITE_BUSY_TIMEOUT_SECONDS", 30.0) * 1000)),
    )
    # Tests use a real file (not :memory:) so that threads and processes share it.
    _db["TEST"] = {"NAME": env.str("SQLITE_TEST_NAME", default=str(VAR_DIR / "test.sqlite3"))}
else:
    # Keep connections across requests, and check them before reuse so that a restarted
    # database server costs one failed request at most, not a dead worker.
    _db["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", 60)
    _db["CONN_HEALTH_CHECKS"] = True
    _db.setdefault("OPTIONS", {})
    _db["OPTIONS"].setdefault("connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", 5))
    # The lifecycle's hot statements are prepared explicitly (jobqueue/lifecycle/pg/cursor.py).
    # psycopg ignores prepare=True when the threshold is None (Django's default); one never
    # reached keeps its automatic preparing off for every other query.
    # JOBQUEUE_PREPARED_STATEMENTS=0, behind a transaction-mode pooler that cannot keep them
    # (PgBouncer before 1.21, Debian 12's 1.18): nothing is prepared, and no server-side
    # cursor is opened outside a transaction (docs/deploying.md).
    # DATABASE_CONNECT_RETRY_SECONDS: open new connections again for that long when they are
    # refused (a PgBouncer or PostgreSQL restart) instead of failing the request at once.
    _retry = env.float("DATABASE_CONNECT_RETRY_SECONDS", 0.0)
    if _retry > 0:
        _db["ENGINE"] = "config.postgresql"
        _db["CONNECT_RETRY_SECONDS"] = _retry
    if _env(env.bool, "PREPARED_STATEMENTS"):
        _db["OPTIONS"].setdefault("prepare_threshold", 2**31 - 1)
    else:
        _db["DISABLE_SERVER_SIDE_CURSORS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.str("DJANGO_STATIC_ROOT", default=str(VAR_DIR / "static"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
    # Job artifacts (docs/outputs.md): the filesystem under var/artifacts by default; any
    # Django storage backend, e.g. "storages.backends.s3.S3Storage" (django-storages, which
    # then reads its AWS_* settings from the environment).
    "artifacts": {
        "BACKEND": env.str("JOBQUEUE_ARTIFACT_STORAGE",
                           default="django.core.files.storage.FileSystemStorage"),
        "OPTIONS": env.json("JOBQUEUE_ARTIFACT_STORAGE_OPTIONS",
                            default={"location": str(VAR_DIR / "artifacts")}),
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"line": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "line"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    # httpx logs every request's URL at INFO; webhook URLs may carry a receiver's token, and
    # the webhook sender logs its failed tries itself (jobqueue.webhooks), without the URL.
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}

# --- The job queue ----------------------------------------------------------------------
# One dict for every lease and attempt default and bound. Durations in seconds. Each is read
# from JOBQUEUE_<name> (_env); the defaults are written once, in jobqueue/conf.py's DEFAULTS.
JOBQUEUE = {
    # Lease given to a claim unless the job agent sets its own.
    "DEFAULT_LEASE_SECONDS": _env(env.int, "DEFAULT_LEASE_SECONDS"),
    # Bounds for an agent's lease_seconds.
    "MIN_LEASE_SECONDS": _env(env.int, "MIN_LEASE_SECONDS"),
    "MAX_LEASE_SECONDS": _env(env.int, "MAX_LEASE_SECONDS"),
    # Attempts a job gets unless its agent or its producer says otherwise, and the bounds.
    "DEFAULT_MAX_ATTEMPTS": _env(env.int, "DEFAULT_MAX_ATTEMPTS"),
    "MIN_MAX_ATTEMPTS": DEFAULTS["MIN_MAX_ATTEMPTS"],
    "MAX_MAX_ATTEMPTS": _env(env.int, "MAX_MAX_ATTEMPTS"),
    # The heartbeat interval suggested on claim is lease_seconds divided by this.
    "HEARTBEAT_DIVISOR": _env(env.int, "HEARTBEAT_DIVISOR"),
    # Reaper: rows per transaction, and the loop's pause between sweeps.
    "REAPER_BATCH_SIZE": _env(env.int, "REAPER_BATCH_SIZE"),
    "REAPER_INTERVAL_SECONDS": _env(env.float, "REAPER_INTERVAL_SECONDS"),
    # Operators are warned when the reaper has not run for longer than this.
    "REAPER_STALE_AFTER_SECONDS": _env(env.int, "REAPER_STALE_AFTER_SECONDS"),
    # Upper bound on how many jobs one batch claim may take.
    "MAX_CLAIM_BATCH": _env(env.int, "MAX_CLAIM_BATCH"),
    # Upper bound on how many claims one batch heartbeat may renew.
    "MAX_HEARTBEAT_BATCH": _env(env.int, "MAX_HEARTBEAT_BATCH"),
    "MAX_REPORT_BATCH": _env(env.int, "MAX_REPORT_BATCH"),
    # Upper bound on a release's retry_after_seconds.
    "MAX_RETRY_AFTER_SECONDS": _env(env.int, "MAX_RETRY_AFTER_SECONDS"),
    # Long-poll (docs/api.md, "Waiting"): the largest wait_seconds a claim or a producer's
    # GET jobs/{id} may ask for, and how many waits one server process holds at once (past
    # it a claim answers as if wait_seconds were 0; config/gunicorn.conf.py sizes its
    # threads from it).
    "MAX_CLAIM_WAIT_SECONDS": _env(env.int, "MAX_CLAIM_WAIT_SECONDS"),
    "MAX_WAITING_CLAIMS": _env(env.int, "MAX_WAITING_CLAIMS"),
    # How many of a process's held waits keep their database connection (the others close
    # theirs while they sleep); a wake-up goes to one of these first (jobqueue/wakeups.py).
    "WARM_WAITS": _env(env.int, "WARM_WAITS"),
    # While anyone waits, each process re-checks this often with one query (a lost NOTIFY
    # never strands a waiter), and (SQLite) reads the wake file this often.
    "WAIT_RECHECK_SECONDS": _env(env.float, "WAIT_RECHECK_SECONDS"),
    "WAKE_FILE_POLL_SECONDS": _env(env.float, "WAKE_FILE_POLL_SECONDS"),
    # PostgreSQL: the listener's own connection (LISTEN needs a session: behind PgBouncer
    # in transaction mode, name a direct connection). Default: DATABASE_URL's database.
    "LISTEN_DATABASE_URL": _env(env.str, "LISTEN_DATABASE_URL"),
    # A group's cancel runs in transactions of at most this many jobs.
    "GROUP_CANCEL_BATCH": _env(env.int, "GROUP_CANCEL_BATCH"),
    # Largest checkpoint (its JSON text, bytes) a heartbeat or progress report may carry.
    "MAX_CHECKPOINT_BYTES": _env(env.int, "MAX_CHECKPOINT_BYTES"),
    # Retryable failures ({"status": "failure", "retry": true}): the job waits
    # retry_backoff_seconds (this default unless the job sets its own) doubled per attempt,
    # at most MAX_RETRY_BACKOFF_SECONDS (also the bound of a job's retry_backoff_seconds),
    # shortened by up to RETRY_JITTER of itself (a fraction from 0 to 1; 0: no jitter).
    "RETRY_BACKOFF_SECONDS": _env(env.int, "RETRY_BACKOFF_SECONDS"),
    "MAX_RETRY_BACKOFF_SECONDS": _env(env.int, "MAX_RETRY_BACKOFF_SECONDS"),
    "RETRY_JITTER": _env(env.float, "RETRY_JITTER"),
    # Bounds of a job's (or its agent's default) max_runtime_seconds, and how far ahead a
    # job's expires_at may be (docs/clocks.md). No default: a job has no runtime limit and
    # never expires unless its producer (or agent) says so.
    "MIN_MAX_RUNTIME_SECONDS": _env(env.int, "MIN_MAX_RUNTIME_SECONDS"),
    "MAX_MAX_RUNTIME_SECONDS": _env(env.int, "MAX_MAX_RUNTIME_SECONDS"),
    "MAX_EXPIRES_IN_SECONDS": _env(env.int, "MAX_EXPIRES_IN_SECONDS"),
    # Retention (prune_jobs, maintenance): days a finished job is kept, by its status (0: keep
    # forever), and jobs deleted per transaction.
    "RETENTION_DAYS": _env(env.float, "RETENTION_DAYS"),  # successful, cancelled
    "RETENTION_FAILED_DAYS": _env(env.float, "RETENTION_FAILED_DAYS"),  # failure, expired
    "PRUNE_BATCH_SIZE": _env(env.int, "PRUNE_BATCH_SIZE"),
    # run_maintenance --loop: seconds between two prunings.
    "PRUNE_INTERVAL_SECONDS": _env(env.float, "PRUNE_INTERVAL_SECONDS"),
    # run_maintenance --loop: artifact clean-up (clean_artifacts) this often, in batches of.
    "ARTIFACT_CLEAN_INTERVAL_SECONDS": _env(env.float, "ARTIFACT_CLEAN_INTERVAL_SECONDS"),
    "ARTIFACT_CLEAN_BATCH_SIZE": _env(env.int, "ARTIFACT_CLEAN_BATCH_SIZE"),
    # run_maintenance --loop: the group watcher (group.finished) this often, groups per
    # transaction.
    "GROUP_WATCH_INTERVAL_SECONDS": _env(env.float, "GROUP_WATCH_INTERVAL_SECONDS"),
    "GROUP_WATCH_BATCH_SIZE": _env(env.int, "GROUP_WATCH_BATCH_SIZE"),
    # run_maintenance --loop: schedules fired this often, schedules per transaction.
    "SCHEDULE_INTERVAL_SECONDS": _env(env.float, "SCHEDULE_INTERVAL_SECONDS"),
    "SCHEDULE_BATCH_SIZE": _env(env.int, "SCHEDULE_BATCH_SIZE"),
    # Webhooks: tries per delivery, the first retry's delay (doubling, with jitter, up to the
    # max), the deadline of one try (the whole request, connect to last byte), how long a
    # sender reserves a delivery it is sending, how many it takes at once, how often
    # maintenance sends, how much of an answer it reads, the networks targets must be in
    # (comma-separated CIDRs; empty: any), how many endpoints it sends to at once, and how
    # many endpoints a workspace may have.
    "WEBHOOK_MAX_ATTEMPTS": _env(env.int, "WEBHOOK_MAX_ATTEMPTS"),
    "WEBHOOK_BACKOFF_SECONDS": _env(env.float, "WEBHOOK_BACKOFF_SECONDS"),
    "WEBHOOK_MAX_BACKOFF_SECONDS": _env(env.float, "WEBHOOK_MAX_BACKOFF_SECONDS"),
    "WEBHOOK_TIMEOUT_SECONDS": _env(env.float, "WEBHOOK_TIMEOUT_SECONDS"),
    "WEBHOOK_LEASE_SECONDS": _env(env.int, "WEBHOOK_LEASE_SECONDS"),
    "WEBHOOK_BATCH_SIZE": _env(env.int, "WEBHOOK_BATCH_SIZE"),
    "WEBHOOK_INTERVAL_SECONDS": _env(env.float, "WEBHOOK_INTERVAL_SECONDS"),
    "WEBHOOK_RESPONSE_BYTES": _env(env.int, "WEBHOOK_RESPONSE_BYTES"),
    "WEBHOOK_ALLOWED_NETWORKS": _env(env.str, "WEBHOOK_ALLOWED_NETWORKS"),
    "WEBHOOK_CONCURRENCY": _env(env.int, "WEBHOOK_CONCURRENCY"),
    "MAX_WEBHOOKS_PER_WORKSPACE": _env(env.int, "MAX_WEBHOOKS_PER_WORKSPACE"),
    # Job outputs (docs/outputs.md): each attempt's log is capped; a holder whose claim was
    # just cancelled, reaped or superseded may still append for the grace period.
    "MAX_LOG_BYTES": _env(env.int, "MAX_LOG_BYTES"),
    "LOG_GRACE_SECONDS": _env(env.int, "LOG_GRACE_SECONDS"),
    # Artifacts: per file (the JSON body cap does not apply), per attempt (bytes and files).
    "MAX_ARTIFACT_BYTES": _env(env.int, "MAX_ARTIFACT_BYTES"),
    "MAX_ATTEMPT_ARTIFACT_BYTES": _env(env.int, "MAX_ATTEMPT_ARTIFACT_BYTES"),
    "MAX_ARTIFACTS_PER_ATTEMPT": _env(env.int, "MAX_ARTIFACTS_PER_ATTEMPT"),
    # Largest report `message` (UTF-8 bytes) and `result` (bytes of its compact JSON) a job
    # keeps: a report over either is refused (400 validation_error) and changes nothing.
    "MAX_MESSAGE_BYTES": _env(env.int, "MAX_MESSAGE_BYTES"),
    "MAX_RESULT_BYTES": _env(env.int, "MAX_RESULT_BYTES"),
    # A job's effect ledger: most entries (keys) it holds; a begin of one more is 413.
    "MAX_EFFECTS_PER_JOB": _env(env.int, "MAX_EFFECTS_PER_JOB"),
}

# --- HTTP API (agents app) --------------------------------------------------------------
# Largest request body the API accepts (bytes), with or without Content-Length: 413 beyond.
# Prepare the hot statements once per connection (off behind PgBouncer < 1.21 in transaction
# mode; see DATABASES above).
JOBQUEUE["PREPARED_STATEMENTS"] = _env(env.bool, "PREPARED_STATEMENTS")
JOBQUEUE["MAX_REQUEST_BYTES"] = _env(env.int, "MAX_REQUEST_BYTES")
# Django's own cap on bodies it reads (forms, the admin) is never below the API's.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(JOBQUEUE["MAX_REQUEST_BYTES"], 2621440)
# Presence: a request authenticated by an agent token records the token's last_used_at and
# its agent's last_seen_at at most this often per token, across every process (two UPDATEs,
# never of job); an agent seen within AGENT_ONLINE_SECONDS is `online`.
JOBQUEUE["AGENT_SEEN_WRITE_SECONDS"] = _env(env.float, "AGENT_SEEN_WRITE_SECONDS")
JOBQUEUE["AGENT_ONLINE_SECONDS"] = _env(env.float, "AGENT_ONLINE_SECONDS")
# The oldest jobqueue-client (major.minor, read from its User-Agent) this server supports: an
# older one is logged once per version and process, WARNING (agents/middleware.py). Requests
# are answered all the same. GET /v1/version says it too.
# Fencing tokens (jobqueue/fencing.py, docs/effects.md): the Ed25519 keys, PEM files, comma
# separated. The first (a private key) signs every claim's `fencing_token`; the others (private
# or public) are only published at /v1/.well-known/jwks.json, so that tokens a retired key
# signed still verify while they may live. Unset: a key generated at first use in
# var/fencing_key.pem (0600), like the secret key. `iss` of every token, and how long clients
# may cache the key set.
JOBQUEUE["FENCING_KEY_FILES"] = env.list("JOBQUEUE_FENCING_KEY_FILES",
                                         default=DEFAULTS["FENCING_KEY_FILES"])
JOBQUEUE["FENCING_ISSUER"] = _env(env.str, "FENCING_ISSUER")
JOBQUEUE["JWKS_MAX_AGE_SECONDS"] = _env(env.int, "JWKS_MAX_AGE_SECONDS")
JOBQUEUE["MIN_CLIENT_VERSION"] = _env(env.str, "MIN_CLIENT_VERSION")
if not re.fullmatch(r"\d{1,6}(\.\d{1,6})?", JOBQUEUE["MIN_CLIENT_VERSION"]):
    raise ImproperlyConfigured("JOBQUEUE_MIN_CLIENT_VERSION must be MAJOR.MINOR, e.g. 0.2")
# /metrics: how many keys of each kind get series of their own (jobqueue_concurrency_*,
# jobqueue_rate_limit_*, jobqueue_fairness_*{workspace_id,key}): the keys with the most jobs held
# back (fairness keys: queued), so that the number of series stays bounded whatever the number
# of keys (0: none).
JOBQUEUE["METRICS_TOP_KEYS"] = _env(env.int, "METRICS_TOP_KEYS")

# Throttle counters live in the default cache. The default LocMem cache is per process, so
# with N server processes a client gets up to N times the rate; point CACHE_URL at a shared
# cache (e.g. redis://...) for one fleet-wide counter.
CACHES = {"default": env.cache("CACHE_URL", default="locmemcache://")}
if CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache":
    # A Redis that stops answering must cost a request a fraction of a second at most (the
    # throttle then lets requests through: agents/throttling.py).
    _redis_timeout = env.float("CACHE_TIMEOUT_SECONDS", 0.25)
    CACHES["default"].setdefault("OPTIONS", {})
    CACHES["default"]["OPTIONS"].setdefault("socket_connect_timeout", _redis_timeout)
    CACHES["default"]["OPTIONS"].setdefault("socket_timeout", _redis_timeout)

REST_FRAMEWORK = {
    "EXCEPTION_HANDLER": "agents.exceptions.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["agents.parsers.StrictJSONParser"],
    # Per credential, "<n>/<s|m|h|d>"; "" or "none" disables. The defaults never slow a
    # healthy fleet (one agent may make thousands of requests a second).
    "DEFAULT_THROTTLE_RATES": {
        "agent": env.str("JOBQUEUE_THROTTLE_AGENT_RATE", default="20000/s"),
        "workspace": env.str("JOBQUEUE_THROTTLE_WORKSPACE_RATE", default="20000/s"),
        # POST /v1/register, per client address: a fleet of hundreds behind one NAT registers
        # within a minute; guessing registration tokens (256-bit secrets) gets nowhere anyway.
        "register": env.str("JOBQUEUE_THROTTLE_REGISTER_RATE", default="1000/m"),
    },
    # How many proxies stand before the server: the address a throttle counts per client
    # (POST /v1/register) is then the one the nearest proxy wrote into X-Forwarded-For
    # (docs/deploy/nginx.conf sets it, replacing what the client sent: 1). 0, the default:
    # the peer's address, never a header a client could make up.
    "NUM_PROXIES": env.int("JOBQUEUE_NUM_PROXIES", default=0),
}

SPECTACULAR_SETTINGS = {
    "TITLE": "jobqueue API",
    "DESCRIPTION": "Pull-based job agents: poll, claim with a lease, heartbeat, report. "
    "See docs/api.md.",
    # The server's version (jobqueue/__init__.py), as /healthz and GET /v1/version say it.
    "VERSION": jobqueue_version,
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # agents/urls.py matches ids loosely (a malformed one is a JSON 404); they are UUIDs.
    "PATH_CONVERTER_OVERRIDES": {"anyid": {"type": "string", "format": "uuid"}},
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "jobqueue.states.CHOICES",
        "ReportedStatusEnum": ["cancelled", "failure", "in_progress", "successful"],
        "FinalReportStatusEnum": ["cancelled", "failure", "successful"],
        "LiveStatusEnum": ["in_progress", "pending", "queued"],  # POST jobs unique_states
    },
    "SCHEMA_PATH_PREFIX": r"/v1/",
    # Request bodies take their declared fields only (an unknown one is a 400).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "agents.schema.closed_request_bodies"],
}
