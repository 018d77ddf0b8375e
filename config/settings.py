"""OpsPlanner settings: one module, every knob read from the environment through config.env.

Two shapes:
- embedded default (no DATABASE_URL, no REDIS_URL): SQLite in WAL mode and a Celery broker on its
  own SQLite file (config/embedded_broker.py), so one machine with nothing but Python runs the
  web server, a worker and the beat;
- production (DATABASE_URL=postgresql://…, REDIS_URL=redis://…): any number of workers anywhere.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from config.env import (
    EnvError,
    env_bool,
    env_database,
    env_int,
    env_list,
    env_optional_str,
    env_redis_url,
    env_str,
)
from opsplanner.adapters import EXECUTORS

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("OPSPLANNER_VAR_DIR", str(BASE_DIR / "var"))).resolve()

DEBUG = env_bool("DEBUG", False)

# A development key exists only so `make run` works out of the box; production must bring its own.
DEVELOPMENT_SECRET_KEY = "opsplanner-development-only-not-secret"
SECRET_KEY = env_optional_str("SECRET_KEY") or ""
if not SECRET_KEY:
    if not DEBUG:
        raise EnvError("SECRET_KEY must be set when DEBUG is off (the development key is refused)")
    SECRET_KEY = DEVELOPMENT_SECRET_KEY
elif SECRET_KEY == DEVELOPMENT_SECRET_KEY and not DEBUG:
    raise EnvError("SECRET_KEY is the development key; set a real secret when DEBUG is off")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "channels",
    "opsplanner",
    "fleet",
    "trains",
    "console",
    "simulation",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Above the size limit, so its early 413 answers carry X-Frame-Options too.
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "config.middleware.ContentSecurityPolicyMiddleware",
    "config.middleware.RequestSizeLimitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

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
                "console.context_processors.permissions",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------------------------
_database = env_database("DATABASE_URL", f"sqlite:///{VAR_DIR / 'opsplanner.sqlite3'}")
DATABASES: dict[str, dict[str, Any]]
if _database.is_sqlite:
    DATABASES = {
        "default": {
            "ENGINE": _database.engine,
            "NAME": _database.name,
            "OPTIONS": {
                # WAL lets the web server read while the worker writes; IMMEDIATE takes the write
                # lock at BEGIN so two writers queue on busy_timeout instead of failing mid-way.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": _database.engine,
            "NAME": _database.name,
            "USER": _database.user,
            "PASSWORD": _database.password,
            "HOST": _database.host,
            "PORT": _database.port,
            "OPTIONS": dict(_database.options),
            "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0),
            "CONN_HEALTH_CHECKS": True,
        }
    }
    # Under ASGI (daphne) every request runs on a fresh thread: a persistent connection is never
    # reused and piles up until PostgreSQL refuses new clients. Web processes use psycopg's pool
    # (per process, DATABASE_POOL_MAX_SIZE connections). Celery workers connect anew for each task:
    # Celery's Django fixup closes the connection before and after every task (CELERY_DB_REUSE_MAX unset),
    # so CONN_MAX_AGE serves management commands and the embedded server, not the workers.
    # The pool is the web's only (config/asgi.py says so): a Celery worker given one by an exported
    # DATABASE_POOL_MAX_SIZE would open the whole pool around every task, as Celery closes it each time.
    _pool_max = env_int("DATABASE_POOL_MAX_SIZE", 8, minimum=0) if env_bool("OPSPLANNER_ASGI", False) else 0
    if _pool_max:
        # Opened at start and kept: a pool that grows on demand opens one connection at a time, and
        # requests queued behind that growth for seconds whenever a burst arrived.
        DATABASES["default"]["OPTIONS"]["pool"] = {"min_size": _pool_max, "max_size": _pool_max, "timeout": 10}
        DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASE_IS_SQLITE = _database.is_sqlite
# The queries compiled once (opsplanner/prepared.py) run as server-side prepared statements after
# this many runs on a connection; 0 never prepares them (behind a PgBouncer in transaction
# mode older than 1.21, which cannot keep a session's prepared statements).
DATABASE_PREPARE_THRESHOLD = env_int("DATABASE_PREPARE_THRESHOLD", 2, minimum=0)

# --- Redis, Celery, Channels --------------------------------------------------------------------
REDIS_URL = env_redis_url("REDIS_URL")
EMBEDDED_BROKER_FILE = VAR_DIR / "broker.sqlite3"

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"visibility_timeout": 3600}
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # channels-redis waits for messages with a 5 s blocking pop; redis-py 8's default read
            # timeout is also 5 s, which cut every idle websocket after 5 s. Give the read more room.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}]},
        }
    }
    # Shared by every web process: API rate limits count per token across all of them.
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    # Our SQLite transport (config/embedded_broker.py): messages are rows in their own SQLite
    # file, so a worker and the beat in other processes see them without any server, and a reader
    # never sees a half-written message. Local to one machine.
    CELERY_BROKER_URL = "opsqlite://localhost/"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "path": str(EMBEDDED_BROKER_FILE),
        # Idle polls only read; 0.1 s keeps a kicked step close to immediate.
        "polling_interval": 0.1,
        "visibility_timeout": 600,
    }
    # The transport has no fanout: no remote control (celery inspect/control) in the embedded mode.
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# The ASGI server `manage.py serve` and the API benchmarks run (compared in BENCHMARKS.md).
ASGI_SERVER = env_str("ASGI_SERVER", "granian").lower()
if ASGI_SERVER not in {"uvicorn", "daphne", "granian"}:
    raise EnvError(f"ASGI_SERVER={ASGI_SERVER!r} is not one of uvicorn, daphne, granian")

CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "opsplanner")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A late-acknowledged task still running when the broker connection drops is delivered again, so
# it is cancelled rather than left to run alongside its redelivery (Celery 6's default; said
# explicitly, which also silences Celery 5's warning). Either way is safe: tasks re-read state.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Who repairs failed hosts: empty for the pool's executor, or one executor for every pool.
REPAIR_EXECUTOR = env_str("REPAIR_EXECUTOR", "")
if REPAIR_EXECUTOR and REPAIR_EXECUTOR not in {a.value for a in EXECUTORS}:
    _names = ", ".join(a.value for a in EXECUTORS)
    raise EnvError(f"REPAIR_EXECUTOR={REPAIR_EXECUTOR!r} must be empty (the pool's executor) or one of: {_names}")
# After a commit that creates work, enqueue the step that acts on it at once instead of waiting for
# the beat. The test process turns this off (its workers, in their own processes, keep it on).
KICK_TASKS = env_bool("KICK_TASKS", True)
TICK_SECONDS = float(env_int("TICK_SECONDS", 2, minimum=1, maximum=3600))
WORKER_HEARTBEAT_SECONDS = env_int("WORKER_HEARTBEAT_SECONDS", 15, minimum=1, maximum=3600)
CELERY_BEAT_SCHEDULE = {
    "tick": {
        "task": "opsplanner.tasks.tick",
        "schedule": TICK_SECONDS,
        "options": {"expires": TICK_SECONDS * 5},
    },
    "trains-tick": {
        "task": "trains.tasks.trains_tick",
        "schedule": TICK_SECONDS,
        "options": {"expires": TICK_SECONDS * 5},
    },
    "simulated-work": {
        "task": "opsplanner.tasks.simulated_work_step",
        "schedule": 1.0,
        "options": {"expires": 5.0},
    },
    "housekeeping": {
        "task": "opsplanner.tasks.housekeeping",
        "schedule": 600.0,
        "options": {"expires": 600.0},
    },
    "advisor-runs-recover": {
        "task": "simulation.tasks.advisor_runs_recover",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    "worker-heartbeat": {
        "task": "opsplanner.tasks.worker_heartbeat",
        "schedule": float(WORKER_HEARTBEAT_SECONDS),
        "options": {"expires": float(max(3 * WORKER_HEARTBEAT_SECONDS, 10))},
    },
}

# --- Auth, i18n, static ---------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Passwords are checked by LoginLimitBackend: after LOGIN_FAILURES_LIMIT wrong ones in a row from one
# client address (LOGIN_FAILURES_LIMIT_ALL_ADDRESSES from all) a user's password is no longer checked
# from it (from anywhere) until LOGIN_FAILURES_WINDOW_SECONDS have passed since the last wrong one.
AUTHENTICATION_BACKENDS = ["console.api.authentication.LoginLimitBackend"]
LOGIN_FAILURES_LIMIT = env_int("LOGIN_FAILURES_LIMIT", 10, minimum=1)
LOGIN_FAILURES_LIMIT_ALL_ADDRESSES = env_int("LOGIN_FAILURES_LIMIT_ALL_ADDRESSES", 100, minimum=1)
LOGIN_FAILURES_WINDOW_SECONDS = env_int("LOGIN_FAILURES_WINDOW_SECONDS", 15 * 60, minimum=1)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
WHITENOISE_USE_FINDERS = True

# --- Security headers (tightened further when DEBUG is off) -------------------------------------
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 3600, minimum=60)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
# Browsers that once reached the site over HTTPS keep to HTTPS (Django sends the header only on
# secure requests). Off in development, a year otherwise.
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 365 * 24 * 3600, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
# Scripts only from this origin: no inline scripts or event handlers anywhere (the pages, the
# admin and the browsable API have none), so injected markup cannot run. Inline styles stay
# allowed (the admin and the browsable API use them). The websocket is same-origin ('self').
CONTENT_SECURITY_POLICY = env_str(
    "CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.api.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.api.permissions.RolePermission"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "console.api.pagination.LimitOffsetPagination",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["console.api.throttling.TokenRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"token": env_str("API_THROTTLE_RATE", "6000/min")},
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "console.api.parsers.JSONParser",  # DRF's, refusing a too deeply nested body as a 400
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
# Integration tokens: hashed at rest, expiring, revocable (django-rest-knox).
REST_KNOX = {
    "TOKEN_TTL": dt.timedelta(hours=env_int("API_TOKEN_TTL_HOURS", 24 * 7, minimum=1)),
    "AUTO_REFRESH": False,
    "TOKEN_LIMIT_PER_USER": env_int("API_TOKENS_PER_USER", 20, minimum=1),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "OpsPlanner API",
    "DESCRIPTION": "Intents, executors, fleet and events. Every write goes through the same services as the UI.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "AdapterEnum": "opsplanner.models.operations.Adapter",
        "OperationKindEnum": "opsplanner.models.operations.OperationKind",
        "OperationStateEnum": "opsplanner.models.operations.OperationState",
        "OperationSourceEnum": "opsplanner.models.operations.OperationSource",
        "TaskStateEnum": "opsplanner.models.operations.TaskState",
        "WorkKindEnum": "opsplanner.models.work_items.WorkKind",
        "WorkStateEnum": "opsplanner.models.work_items.WorkState",
        "ApprovalKindEnum": "opsplanner.models.approvals.ApprovalKind",
        "ApprovalStateEnum": "opsplanner.models.approvals.ApprovalState",
        "HostStateEnum": "fleet.models.hosts.HostState",
        "DomainKindEnum": "fleet.models.pools.DomainKind",
        "ComponentLayerEnum": "fleet.models.components.ComponentLayer",
        "TrainStateEnum": "trains.models.trains.TrainState",
        "VisitStateEnum": "trains.models.trains.VisitState",
        "UpgradeStateEnum": "trains.models.upgrades.UpgradeState",
    },
}
# Idempotency-Key answers are kept this long; a retry after that is a new request.
IDEMPOTENCY_KEEP_HOURS = env_int("IDEMPOTENCY_KEEP_HOURS", 48, minimum=1)
# Request bodies above this are refused (413) before they are parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 1024 * 1024, minimum=1024)

LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()
if LOG_LEVEL not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise EnvError(f"LOG_LEVEL={LOG_LEVEL!r} is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
# One JSON object per line (config.logs, for log shippers) or plain text for a terminal.
LOG_FORMAT = env_str("LOG_FORMAT", "text" if DEBUG else "json").lower()
if LOG_FORMAT not in {"json", "text"}:
    raise EnvError(f"LOG_FORMAT={LOG_FORMAT!r} is not one of json, text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "config.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json" if LOG_FORMAT == "json" else "plain"}
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Django's own console handlers would print django.* records a second time, in another format.
        "django": {"handlers": [], "propagate": True},
        "django.server": {"handlers": [], "propagate": True},
    },
}
# GET /metrics answers a scraper that sends "Authorization: Bearer <METRICS_TOKEN>" (unset: only
# logged-in users who may see the fleet). At least 16 characters: it is a password.
METRICS_TOKEN = env_optional_str("METRICS_TOKEN") or ""
if METRICS_TOKEN and len(METRICS_TOKEN) < 16:
    raise EnvError("METRICS_TOKEN is shorter than 16 characters; use a long random value")
