"""Django settings for gpuadmin.

Everything a lab may change comes from the environment (see README). With no
DATABASE_URL and no REDIS_URL the panel runs on one box: SQLite in WAL mode and
Celery's filesystem broker, both under GPUADMIN_DATA_DIR.

Importing this module writes nothing: the data directory and its secret key
are made beforehand by `python -m gpuadmin.data_dir` (`make run` runs it), and
a missing one stops here with an error that names that command.
"""

from __future__ import annotations

import socket
import ssl
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from gpuadmin import data_dir
from gpuadmin.accounts.directory import config as directory_config
from gpuadmin.accounts.throttling import UNIX_SOCKET, parse_trusted_proxies
from gpuadmin.env import env_bool, env_int, env_secret, env_str
from gpuadmin.probe.budget import DEFAULT_SNAPSHOT_MAX_BYTES
from gpuadmin.probe.kill.protected import pattern_list
from gpuadmin.wire.snapshot_update import DEFAULT_UPDATE_MAX_BYTES

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = data_dir.data_dir()
try:
    SECRET_KEY = data_dir.secret_key(DATA_DIR)
except data_dir.DataDirNotPrepared as exc:
    raise ImproperlyConfigured(str(exc)) from None
DEBUG = env_bool("GPUADMIN_DEBUG", False)
_DEFAULT_ALLOWED_HOSTS = "127.0.0.1,localhost,[::1],testserver"
ALLOWED_HOSTS = [h for h in env_str("GPUADMIN_ALLOWED_HOSTS", _DEFAULT_ALLOWED_HOSTS).split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in env_str("GPUADMIN_CSRF_TRUSTED_ORIGINS").split(",") if o]

INSTALLED_APPS = [
    # django.contrib.admin, every page behind a recent re-authentication (gpuadmin/accounts/admin_site.py).
    "gpuadmin.accounts.admin_site.SudoAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "rest_framework",
    "drf_spectacular",
    "knox",
    "axes",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "csp",
    "gpuadmin.accounts",
    "gpuadmin.fleet",
    "gpuadmin.kills",
    "gpuadmin.audit",
    "gpuadmin.notify",
    "gpuadmin.usage",
    "gpuadmin.fairuse",
    "gpuadmin.web",
]

MIDDLEWARE = [
    # First, so it compresses what every other middleware wrote (pages, htmx fragments, the API's JSON);
    # BREACH: docs/security.md ("Compression").
    "django.middleware.gzip.GZipMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Who is acting, for the audit events of account changes (gpuadmin/accounts/audit_trail.py).
    "gpuadmin.accounts.audit_trail.ActorMiddleware",
    # Last, as django-axes asks: it turns a lockout into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "gpuadmin.urls"
WSGI_APPLICATION = "gpuadmin.wsgi.application"

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
                # The nav's "needs attention" count (templates/web/_nav_attention.html), read only if shown.
                "gpuadmin.web.attention.nav_attention",
            ],
        },
    },
]

# SQLite for one box, PostgreSQL for a fleet: DATABASE_URL decides.
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    # Health checks let a long-lived worker survive a PostgreSQL restart. Nothing
    # connects until a query runs: an agent never queries, so it needs no database.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Ingest's fixed statements (fleet/storage/statements.py) bind on the server and are prepared on
        # their first run, once per connection. Django's own cursors bind on the client and never
        # prepare, whatever this says. A pooler in transaction mode must keep prepared statements
        # per client (PgBouncer: max_prepared_statements).
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 0
    # A PostgreSQL streaming replica for the pages that only show reported state; what reads it and
    # what never does is gpuadmin/db_router.py's rule (docs/deploy.md, "Growing beyond one box").
    DATABASE_REPLICA_URL = env_str("GPUADMIN_DATABASE_REPLICA_URL")
    if DATABASE_REPLICA_URL:
        replica = dj_database_url.parse(DATABASE_REPLICA_URL, conn_max_age=60, conn_health_checks=True)
        if replica["ENGINE"] != DATABASES["default"]["ENGINE"]:
            raise ImproperlyConfigured("GPUADMIN_DATABASE_REPLICA_URL must name the same engine as "
                                       "DATABASE_URL (a streaming replica of it)")
        replica["OPTIONS"] = {**replica.get("OPTIONS", {}), **DATABASES["default"].get("OPTIONS", {})}
        # Tests get no database of their own for it: it is the primary's copy.
        replica["TEST"] = {"MIRROR": "default"}
        DATABASES["replica"] = replica
        DATABASE_ROUTERS = ["gpuadmin.db_router.ReplicaRouter"]
        MIDDLEWARE.insert(MIDDLEWARE.index("axes.middleware.AxesMiddleware"),
                          "gpuadmin.db_router.ReplicaPagesMiddleware")
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / data_dir.SQLITE_DATABASE),
            "OPTIONS": {
                # WAL lets the web process read while a worker writes; IMMEDIATE
                # takes the write lock at BEGIN so two writers queue instead of
                # failing with "database is locked" half-way through.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }

if env_str("GPUADMIN_DATABASE_REPLICA_URL") and not DATABASE_URL:
    raise ImproperlyConfigured("GPUADMIN_DATABASE_REPLICA_URL needs DATABASE_URL: a replica of what?")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# django-axes counts failed logins first (and refuses a locked-out one before
# the password is even checked), then Django checks the password.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Sign-in with the lab's directory (gpuadmin/accounts/directory/, docs/deploy.md): LDAP when
# GPUADMIN_LDAP_SERVER_URI is set, OpenID Connect when GPUADMIN_OIDC_CLIENT_ID is; local accounts
# keep working beside both (ModelBackend first).
_LDAP = directory_config.ldap_settings()
_OIDC = directory_config.oidc_settings()
globals().update(_LDAP)
globals().update(_OIDC)
AUTHENTICATION_BACKENDS += [directory_config.LDAP_BACKEND] if _LDAP else []
AUTHENTICATION_BACKENDS += [directory_config.OIDC_BACKEND] if _OIDC else []
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "fleet"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("GPUADMIN_TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / data_dir.STATIC_ROOT  # made by the data dir step (WhiteNoise warns without it)
# Pages name each static file by a hash of its content (css/gpuadmin.3f2a….css): collectstatic
# writes those copies and their gzip twins into STATIC_ROOT, and WhiteNoise serves them compressed
# and cached "forever" (ten years), since a change makes a new name. `make run` (gpuadmin/run.py)
# and the web unit run collectstatic before serving. GPUADMIN_STATIC_HASHED=0 names the files
# as they are: the tests do (Django's live server serves from the finders, which know no
# hashed names), and so can a developer who edits the CSS without restarting.
# WhiteNoise also serves static/ straight from the finders (unhashed names, max-age 60).
WHITENOISE_USE_FINDERS = True
# What Django's storages write (collectstatic's copies and manifest) is as private as the rest of
# the data directory; its default, 0644, made the next start refuse the directory (data_dir.exposure).
FILE_UPLOAD_PERMISSIONS = data_dir.FILE_MODE
FILE_UPLOAD_DIRECTORY_PERMISSIONS = data_dir.DIRECTORY_MODE
STATIC_HASHED = env_bool("GPUADMIN_STATIC_HASHED", True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage" if STATIC_HASHED
        else "django.contrib.staticfiles.storage.StaticFilesStorage",
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads it from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

# Production, behind a reverse proxy that terminates TLS (docs/deploy.md).
# GPUADMIN_HTTPS=1 says browsers reach the panel over HTTPS only: cookies are
# sent over HTTPS only, browsers are told to use nothing else (HSTS), and the
# proxy's X-Forwarded-Proto is trusted, so the proxy must always set it.
# With it, a real GPUADMIN_SECRET_KEY and DEBUG off, `check --deploy` is clean.
if env_bool("GPUADMIN_HTTPS", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("GPUADMIN_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("GPUADMIN_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("GPUADMIN_HSTS_PRELOAD", True)

# Login throttling (django-axes): 5 failures within 15 minutes lock that user
# name from that address for 15 minutes after the last failure (a failure
# while locked starts the 15 minutes again). gpuadmin/accounts/throttling.py
# says which address counts behind the reverse proxy.
AXES_FAILURE_LIMIT = 5
# Whose X-Forwarded-For is believed: these addresses or networks, and "unix" for gunicorn's Unix
# socket (deploy/: only nginx can open it). Any other peer's own address counts, whatever it claims.
GPUADMIN_TRUSTED_PROXIES = parse_trusted_proxies(env_str("GPUADMIN_TRUSTED_PROXIES", UNIX_SOCKET))
AXES_COOLOFF_TIME = timedelta(minutes=env_int("GPUADMIN_LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_LOCKOUT_CALLABLE = "gpuadmin.accounts.views.locked_out"
AXES_CLIENT_IP_CALLABLE = "gpuadmin.accounts.throttling.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

# Approving needs a recent authentication ("sudo mode", gpuadmin/accounts/sudo.py):
# a login or a re-authentication no older than this; with TOTP required, that
# re-authentication also checked a code from the approver's device.
GPUADMIN_REAUTH_MAX_AGE_SECONDS = env_int("GPUADMIN_REAUTH_MAX_AGE_SECONDS", 15 * 60)
GPUADMIN_REQUIRE_TOTP_FOR_APPROVAL = env_bool("GPUADMIN_REQUIRE_TOTP_FOR_APPROVAL", False)
OTP_TOTP_ISSUER = "gpuadmin"

# Content-Security-Policy (django-csp): scripts and styles from this site only,
# nothing inline, no eval. htmx is configured to match (templates/base.html).
# style-src has no 'unsafe-inline' either: the templates carry no style
# attributes (the memory bars are SVG), so injected markup cannot restyle the
# page to hide or fake a warning.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        # The OpenID Connect provider: re-authenticating after a form's POST redirects there.
        "form-action": [SELF, *([directory_config.provider_origin(_OIDC)] if _OIDC else [])],
        "frame-ancestors": [NONE],
    },
}

# API tokens (django-rest-knox): only a hash is stored, and each expires.
GPUADMIN_API_TOKEN_DAYS = env_int("GPUADMIN_API_TOKEN_DAYS", 90)
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=GPUADMIN_API_TOKEN_DAYS),
    "AUTH_HEADER_PREFIX": "Token",
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "knox.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["gpuadmin.accounts.permissions.IsViewer"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PAGINATION_CLASS": None,
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# The OpenAPI schema at /api/v1/schema/ (gpuadmin/api_schema.py holds the response shapes).
SPECTACULAR_SETTINGS = {
    "TITLE": "gpuadmin API",
    "DESCRIPTION": "Hosts, processes, kill requests and the audit log of a gpuadmin panel (docs/api.md).",
    "VERSION": "1",
    "OAS_VERSION": "3.1.0",  # JSON Schema 2020-12, as the snapshot schema the processes come from
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["gpuadmin.accounts.permissions.IsViewer"],
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gpuadmin.web.api_docs.add_components",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("GPUADMIN_LOG_LEVEL", "INFO")},
    "loggers": {
        # django-axes logs every successful login at INFO; lockouts are audit events (and WARNING).
        "axes": {"level": "WARNING"},
        # Celery says "received" and "succeeded" at INFO for every task: at fleet rate two lines per
        # snapshot, hundreds a second into the journal, which buries what matters and costs the
        # worker CPU it needs for ingest. Failures stay (ERROR), retries are logged as WARNING
        # (gpuadmin/celery.py); GPUADMIN_TASK_LOG_LEVEL=INFO shows every task again, and every batch
        # of snapshot updates (gpuadmin/fleet/update_batches.py).
        **{name: {"level": env_str("GPUADMIN_TASK_LOG_LEVEL", "WARNING")}
           for name in ("celery.worker.strategy", "celery.app.trace", "gpuadmin.fleet.update_batches")},
        # Every signed head of the audit chain reaches the journal whatever GPUADMIN_LOG_LEVEL says.
        "gpuadmin.audit.anchors": {"level": "INFO"},
    },
}

# --- gpuadmin itself -------------------------------------------------------
GPUADMIN_HOST_NAME = env_str("GPUADMIN_HOST_NAME") or socket.gethostname()
GPUADMIN_PROBE_INTERVAL_SECONDS = env_int("GPUADMIN_PROBE_INTERVAL", 10)
# A host with no snapshot for this many intervals shows as offline.
GPUADMIN_OFFLINE_AFTER_INTERVALS = 3
# Central rejects a bigger snapshot; the agent reads the same variable and fits what it sends
# under it (gpuadmin/probe/budget.py), so set it to the same value on both sides.
GPUADMIN_SNAPSHOT_MAX_BYTES = env_int("GPUADMIN_SNAPSHOT_MAX_BYTES", DEFAULT_SNAPSHOT_MAX_BYTES)
# Between full snapshots an agent sends updates (gpuadmin/wire/snapshot_update.py): a full one at
# least this often, and an update over this size goes as a full one (central refuses bigger updates).
GPUADMIN_FULL_SNAPSHOT_SECONDS = max(0, env_int("GPUADMIN_FULL_SNAPSHOT_SECONDS", 300))
GPUADMIN_SNAPSHOT_UPDATE_MAX_BYTES = min(
    env_int("GPUADMIN_SNAPSHOT_UPDATE_MAX_BYTES", DEFAULT_UPDATE_MAX_BYTES), GPUADMIN_SNAPSHOT_MAX_BYTES
)
GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES = env_int(
    "GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES", 512 * 1024 * 1024
)
GPUADMIN_PID_USAGE_WARN_RATIO = 0.8
# History (gpuadmin/fleet/history/retention.py): raw samples are kept this many days (read by the
# 1-hour chart, the findings' last hour and the roll-up), their 5-minute rollups (min/mean/max) this
# many (the 24-hour chart), the 30-minute rollups of those (the 7- and 30-day charts) this many.
GPUADMIN_HISTORY_RAW_DAYS = env_int("GPUADMIN_HISTORY_RAW_DAYS", 1)
GPUADMIN_HISTORY_FINE_DAYS = env_int("GPUADMIN_HISTORY_FINE_DAYS", 2)
GPUADMIN_HISTORY_DAYS = env_int("GPUADMIN_HISTORY_DAYS", 90)
# History's memory step: a process's GPU memory, and a GPU's memory used or attributed, is stored again
# only when it moved by more than this (or the process's state changed; gpuadmin/fleet/history/record.py).
GPUADMIN_HISTORY_PROCESS_STEP_BYTES = env_int("GPUADMIN_HISTORY_PROCESS_STEP_BYTES", 64 * 1024 * 1024)
# A GPU's or host's raw sample is written when a figure moved past its step, and at least this often
# (the 1-hour chart's points and the 5-minute rollups' samples while nothing moves).
GPUADMIN_HISTORY_RAW_SECONDS = max(1, env_int("GPUADMIN_HISTORY_RAW_SECONDS", 60))
# At most this many processes of one snapshot get (or keep) a history of their own, the biggest GPU
# holders first: a signed snapshot with 15,000 made-up holders must not add 15,000 rows every interval.
GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT = max(1, env_int("GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT", 500))
# The usage ledger (gpuadmin/usage/): a process holds a GPU while its memory there is above this; the
# ledger's days are kept this long; what ingest adds up is written to the ledger at most this often
# (the page and the API lag by as much); ledger off: ingest keeps none (the benchmarks' side by side).
GPUADMIN_USAGE_HELD_BYTES = env_int("GPUADMIN_USAGE_HELD_BYTES", 256 * 1024 * 1024)
GPUADMIN_USAGE_DAYS = env_int("GPUADMIN_USAGE_DAYS", 400)
GPUADMIN_USAGE_FLUSH_SECONDS = env_int("GPUADMIN_USAGE_FLUSH_SECONDS", 900)
GPUADMIN_USAGE_LEDGER = env_bool("GPUADMIN_USAGE_LEDGER", True)
# A host's offered key nobody accepted is withdrawn after this long without a snapshot renewing it,
# freeing its slot of the 100 awaiting acceptance (gpuadmin/fleet/intake/trust.py).
GPUADMIN_HOST_OFFER_EXPIRY_SECONDS = max(60, env_int("GPUADMIN_HOST_OFFER_EXPIRY_SECONDS", 24 * 3600))
# Findings drawn from history (gpuadmin/fleet/findings/rules.py): a suspected leak is GPU
# memory that rose in this many snapshots without falling; an idle holder keeps
# GPU memory at 0% utilization this long; PIDs "run out" when the trend of the
# last hour reaches pid_max within the horizon.
GPUADMIN_LEAK_RISING_SAMPLES = env_int("GPUADMIN_LEAK_RISING_SAMPLES", 10)
GPUADMIN_IDLE_HOLDER_SECONDS = env_int("GPUADMIN_IDLE_HOLDER_SECONDS", 3600)
GPUADMIN_PID_FORECAST_HORIZON_SECONDS = env_int("GPUADMIN_PID_FORECAST_HORIZON_SECONDS", 24 * 3600)
# Bearer token for /metrics (gpuadmin/metrics.py); unset, /metrics answers 404.
GPUADMIN_METRICS_TOKEN = env_secret("GPUADMIN_METRICS_TOKEN")

# Signatures (docs/security.md). Central signs kill orders with the key at this
# path (made by the data dir step, or GPUADMIN_SIGNING_KEY_FILE); an agent
# verifies them with GPUADMIN_CENTRAL_PUBLIC_KEY (or _FILE) and signs what it
# sends with its own key in its data directory. Keys are read when used (gpuadmin/keys.py).
GPUADMIN_SIGNING_KEY_PATH = data_dir.central_signing_key_path(DATA_DIR)
GPUADMIN_CENTRAL_PUBLIC_KEY = env_secret("GPUADMIN_CENTRAL_PUBLIC_KEY")
# The audit chain's signed heads (gpuadmin/audit/anchors.py) are appended to this file and logged
# (logger gpuadmin.audit.anchors; to syslog too when GPUADMIN_AUDIT_ANCHOR_SYSLOG names its socket,
# e.g. /dev/log). In production the file belongs where the database's writers cannot edit it.
GPUADMIN_AUDIT_ANCHOR_FILE = Path(env_str("GPUADMIN_AUDIT_ANCHOR_FILE") or DATA_DIR / data_dir.AUDIT_ANCHORS)
GPUADMIN_AUDIT_ANCHOR_SYSLOG = env_str("GPUADMIN_AUDIT_ANCHOR_SYSLOG")

# Kill workflow (see gpuadmin/kills).
GPUADMIN_ALLOW_SELF_APPROVAL = env_bool("GPUADMIN_ALLOW_SELF_APPROVAL", False)
# A person may stop processes that run as their own mapped uids ("My GPUs") with no second admin:
# on by default, since it gives nobody a power they lack (the owner can already kill their own
# processes over ssh) and the agent re-checks each target's uid before every signal.
GPUADMIN_SELF_SERVICE = env_bool("GPUADMIN_SELF_SERVICE", True)
# A nudge (one person asking another to release a GPU, gpuadmin/fairuse): at most one per pair of
# people per interval; ignored this long, it becomes a kill request that approvers decide on.
GPUADMIN_NUDGE_INTERVAL_SECONDS = env_int("GPUADMIN_NUDGE_INTERVAL_SECONDS", 3600)
GPUADMIN_NUDGE_ESCALATE_MINUTES = env_int("GPUADMIN_NUDGE_ESCALATE_MINUTES", 60)
GPUADMIN_PENDING_EXPIRY_SECONDS = env_int("GPUADMIN_PENDING_EXPIRY_SECONDS", 3600)
GPUADMIN_APPROVED_START_DEADLINE_SECONDS = env_int("GPUADMIN_APPROVED_START_DEADLINE_SECONDS", 120)
# After a kill, the host's snapshots that may still show its targets' GPU memory coming back;
# what has not come back by then is called not released (a finding names what holds it).
GPUADMIN_MEMORY_RELEASE_SNAPSHOTS = env_int("GPUADMIN_MEMORY_RELEASE_SNAPSHOTS", 3)
# --- Notifications (gpuadmin/notify) ---------------------------------------------
# Links in messages point here (the panel as people reach it).
GPUADMIN_BASE_URL = env_str("GPUADMIN_BASE_URL", "http://localhost:8000")
# Approvers are warned once when a pending request has this long left.
GPUADMIN_NOTIFY_EXPIRY_WARNING_SECONDS = env_int("GPUADMIN_NOTIFY_EXPIRY_WARNING_SECONDS", 600)
# A failed delivery is tried again this many times, waiting this long, then twice as long each time.
GPUADMIN_NOTIFY_RETRIES = env_int("GPUADMIN_NOTIFY_RETRIES", 4)
GPUADMIN_NOTIFY_RETRY_SECONDS = env_int("GPUADMIN_NOTIFY_RETRY_SECONDS", 30)
# Notification URLs must name public servers (gpuadmin/notify/delivery.py): 1 allows addresses that
# are not (the lab's own webhook on 10.x, or on this box), for every person's URLs.
GPUADMIN_NOTIFY_ALLOW_PRIVATE = env_bool("GPUADMIN_NOTIFY_ALLOW_PRIVATE", False)
# Email goes through Django's backend (Apprise's djangomail:// plugin, gpuadmin/notify/delivery.py).
EMAIL_BACKEND = env_str("GPUADMIN_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("GPUADMIN_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("GPUADMIN_EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("GPUADMIN_EMAIL_USER")
EMAIL_HOST_PASSWORD = env_secret("GPUADMIN_EMAIL_PASSWORD")
EMAIL_USE_TLS = env_bool("GPUADMIN_EMAIL_STARTTLS", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = env_str("GPUADMIN_EMAIL_FROM", "gpuadmin@localhost")

GPUADMIN_PROTECTED_USERS = [u for u in env_str("GPUADMIN_PROTECTED_USERS", "").split(",") if u]
GPUADMIN_PROTECTED_UIDS = [int(u) for u in env_str("GPUADMIN_PROTECTED_UIDS", "").split(",") if u]
# Regular expressions searched in each target's command line and executable path: a
# JSON list or one per line (a comma belongs to many patterns, so it separates nothing).
GPUADMIN_PROTECTED_COMMAND_PATTERNS = pattern_list(
    env_str("GPUADMIN_PROTECTED_COMMAND_PATTERNS", ""), "GPUADMIN_PROTECTED_COMMAND_PATTERNS"
)

# --- Celery: Redis when REDIS_URL is set, else a broker that needs no server --
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    # redis://:password@host:6379/0 carries Redis's password; rediss:// is Redis over TLS, and
    # the server's certificate is always verified (kombu alone would not verify it): against
    # GPUADMIN_REDIS_CA_FILE when set (a lab's own CA), else the system's CAs. A URL with its
    # own ssl_* options (?ssl_cert_reqs=required&ssl_ca_certs=/etc/gpuadmin/redis-ca.pem)
    # is used as it is: kombu lets those replace these.
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {"visibility_timeout": 3600}
    if REDIS_URL.startswith("sentinel://"):
        # Redis Sentinel: sentinel://:redis-password@sentinel1:26379;sentinel://sentinel2:26379;...
        # kombu asks the Sentinels which Redis is the master named here, and asks again after a
        # failover. The URL's password is the Redis server's; the Sentinels' own, if any, is apart.
        CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = env_str("GPUADMIN_REDIS_SENTINEL_MASTER")
        if not CELERY_BROKER_TRANSPORT_OPTIONS["master_name"]:
            raise ImproperlyConfigured("a sentinel:// REDIS_URL needs GPUADMIN_REDIS_SENTINEL_MASTER, "
                                       "the master's name in the Sentinels' configuration")
        if env_secret("GPUADMIN_REDIS_SENTINEL_PASSWORD"):
            CELERY_BROKER_TRANSPORT_OPTIONS["sentinel_kwargs"] = {
                "password": env_secret("GPUADMIN_REDIS_SENTINEL_PASSWORD")}
    if REDIS_URL.startswith("rediss://") and "ssl_cert_reqs" not in REDIS_URL:
        CELERY_BROKER_USE_SSL: dict[str, object] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        if env_str("GPUADMIN_REDIS_CA_FILE"):
            CELERY_BROKER_USE_SSL["ssl_ca_certs"] = env_str("GPUADMIN_REDIS_CA_FILE")
else:
    # gpuadmin's own filesystem transport (gpuadmin/broker/filesystem.py,
    # docs/broker.md): kombu's, with atomic writes and crash-safe claims. It
    # makes its folders under data_folder itself. The URL's scheme is not
    # used: broker_transport names the class.
    CELERY_BROKER_URL = "filesystem://localhost/"  # the host part means nothing; kombu warns without one
    CELERY_BROKER_TRANSPORT = "gpuadmin.broker.filesystem:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {"data_folder": str(DATA_DIR / data_dir.BROKER)}
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "central"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Tasks, not Celery's Django fixup, decide when a database connection goes (gpuadmin/celery.py); the
# fixup's own count then closes them only every this many tasks of a process.
CELERY_DB_REUSE_MAX = 1000
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / data_dir.BEAT_SCHEDULE_FILE)
