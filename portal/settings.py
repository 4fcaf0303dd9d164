"""Tessera's settings, driven only by the environment, grouped by concern.

With no configuration at all Tessera runs embedded: SQLite under var/, an in-memory channel layer and tasks run
in-process, so `make demo` needs no services. DATABASE_URL and REDIS_URL switch to PostgreSQL and Redis.
Any variable may instead be read from a file named by VARIABLE_FILE (Docker and Kubernetes secrets).
"""

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.FileAwareEnv()

# --- Core -------------------------------------------------------------------------------------------------
DEBUG = env.bool("DEBUG", default=False)
# The embedded default key is for a laptop demo only: its "django-insecure-" prefix makes `check --deploy` fail
# (security.W009), so a production deployment cannot pass its checks with it.
EMBEDDED_SECRET_KEY = "django-insecure-tessera-embedded-demo-key-set-SECRET_KEY-in-production"
SECRET_KEY = env.str("SECRET_KEY", default="") or EMBEDDED_SECRET_KEY
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
VAR_DIR = Path(env.str("TESSERA_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "portal",
    "quotas",
    "scheduling",
    "scheduling.history",
    "frontend",
    "demo",
]

MIDDLEWARE = [
    # First: every later line of the request carries its id (portal/logs.py).
    "portal.logs.RequestIdMiddleware",
    "portal.metrics.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into the lockout answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The project's own overrides of third-party templates (the API docs pages).
        "DIRS": [BASE_DIR / "portal" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "frontend.context_processors.portal",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------------------------------------
# PostgreSQL is the source of truth in production; SQLite keeps the embedded demo free of services.
DATABASES = {
    # An empty DATABASE_URL means unset, as an empty REDIS_URL does.
    "default": env.db_url_config(
        env.str("DATABASE_URL", default="") or f"sqlite:///{VAR_DIR / 'tessera.sqlite3'}"
    ),
}
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=0))
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The embedded demo serves many requests, the scheduling loop and the agents' reports from threads of one
    # process: write-ahead logging lets readers go on during a write, writers take the lock when their
    # transaction begins (no upgrade that could fail) and wait for each other up to 20 s rather than failing
    # with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;",
        }
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USING_POSTGRES = DATABASES["default"]["ENGINE"].endswith("postgresql")

# --- Redis: broker and channel layer ----------------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")

# channels_redis waits for messages with a 5 s BZPOPMIN, and redis-py 8 gives every read a 5 s socket timeout by
# default: on a busy host the reply to an idle wait lands after the timeout and the consumer (an agent's socket)
# is dropped. Reads get 10 s, longer than any blocking wait.
CHANNEL_REDIS_SOCKET_TIMEOUT_S = 10
# redis-py's asyncio pool refuses a 101st connection in use ("Too many connections"): a web process serving 1,000
# agents' sockets joins and leaves their groups at once when they (re)connect, far past 100 for a moment
# (bench/cluster_scale.py). Each connection in use is one short operation; Redis takes 10,000 clients by default.
CHANNEL_REDIS_MAX_CONNECTIONS = env.int("CHANNEL_REDIS_MAX_CONNECTIONS", default=2000)
CHANNEL_LAYER_CAPACITY = env.int("CHANNEL_LAYER_CAPACITY", default=10_000)

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "socket_timeout": CHANNEL_REDIS_SOCKET_TIMEOUT_S,
                        "max_connections": CHANNEL_REDIS_MAX_CONNECTIONS,
                    }
                ],
                # Messages waiting for one process (every socket it serves shares one inbox), past which pushes are
                # dropped: 100 by default, which a wave of job ends at 500 nodes a process went over.
                "capacity": CHANNEL_LAYER_CAPACITY,
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Celery -----------------------------------------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL or "memory://")
CELERY_RESULT_BACKEND = None
# Without a broker, tasks run in-process when they are queued (the embedded demo and plain unit tests).
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=not REDIS_URL)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT_S", default=3600)}

# --- Scheduling -------------------------------------------------------------------------------------------
TESSERA_SCHEDULER_PROFILE = env.str("TESSERA_SCHEDULER_PROFILE", default="default")
TESSERA_CYCLE_INTERVAL_S = env.float("TESSERA_CYCLE_INTERVAL_S", default=5.0)
# A long queue is scored whole only this often (a full cycle); the cycles requested in between (a submit, a job
# ending) are incremental passes over the head of the queue and the jobs no cycle has seen yet, placing them on
# what is free now without re-scoring the rest (scheduling/cycle/runner.py). Below
# TESSERA_INCREMENTAL_MIN_PENDING waiting jobs every cycle is full.
TESSERA_FULL_CYCLE_INTERVAL_S = env.float("TESSERA_FULL_CYCLE_INTERVAL_S", default=15.0)
TESSERA_INCREMENTAL_MIN_PENDING = env.int("TESSERA_INCREMENTAL_MIN_PENDING", default=2000)
TESSERA_INCREMENTAL_QUEUE_DEPTH = env.int("TESSERA_INCREMENTAL_QUEUE_DEPTH", default=500)
TESSERA_NODE_LOST_AFTER_S = env.float("TESSERA_NODE_LOST_AFTER_S", default=50.0)
# A job's supervisor stops it once its node's agent has not been heard by the portal for this long (the agent died,
# or lost the portal, Redis does not count); the portal re-places a lost node's jobs only after this, the job's
# preemption grace and TESSERA_FENCE_MARGIN_S have all passed since the node's last heartbeat, so a placement never
# runs twice. Outages shorter than this stop nothing (Kubernetes waits 5 min before evicting a silent node's pods).
TESSERA_AGENT_FENCE_AFTER_S = env.float("TESSERA_AGENT_FENCE_AFTER_S", default=600.0)
# The heartbeat interval the agents are run with (their --heartbeat-s): the cluster map calls a node's agent silent
# after two of them.
TESSERA_AGENT_HEARTBEAT_S = env.float("TESSERA_AGENT_HEARTBEAT_S", default=5.0)
TESSERA_FENCE_MARGIN_S = env.float("TESSERA_FENCE_MARGIN_S", default=30.0)
# Beat sends periodic tasks only while it holds a Redis lock of this lifetime (portal/beat.py): a second beat stands
# by and takes over within one TTL of the first one's death.
TESSERA_BEAT_LOCK_TTL_S = env.float("TESSERA_BEAT_LOCK_TTL_S", default=30.0)
# Threads (each with its own database connection) that handle the agents' reports in one portal process.
TESSERA_AGENT_DB_THREADS = env.int("TESSERA_AGENT_DB_THREADS", default=4)
TESSERA_FAIRSHARE_HALF_LIFE_S = env.float("TESSERA_FAIRSHARE_HALF_LIFE_S", default=7 * 24 * 3600.0)
TESSERA_MAX_REQUEUES = env.int("TESSERA_MAX_REQUEUES", default=10)
# The most tasks one job array may have (its pending tasks are one row until placed).
TESSERA_MAX_ARRAY_TASKS = env.int("TESSERA_MAX_ARRAY_TASKS", default=10_000)
# A multi-node job's rendezvous port (MASTER_PORT) comes from this range, one per live gang on its rank-0 host
# (torchrun's default, 29500, is the first). Keep the range free of other services on the GPU hosts.
TESSERA_GANG_PORT_FIRST = env.int("TESSERA_GANG_PORT_FIRST", default=29500)
TESSERA_GANG_PORT_LAST = env.int("TESSERA_GANG_PORT_LAST", default=29999)
# The execution pipeline (scheduling/tasks.py, docs/operations.md): how fast cycles and the watchdog react.
TESSERA_CYCLE_DEBOUNCE_S = env.float("TESSERA_CYCLE_DEBOUNCE_S", default=0.05)
# The cycle lock's holder renews it every third of this: a holder that dies holds up scheduling this long at most.
TESSERA_CYCLE_LOCK_TTL_S = env.float("TESSERA_CYCLE_LOCK_TTL_S", default=10.0)
# A cycle running longer than this stops renewing the lock, so a stuck worker holds scheduling up at most this long.
TESSERA_CYCLE_MAX_S = env.float("TESSERA_CYCLE_MAX_S", default=120.0)
TESSERA_WATCHDOG_INTERVAL_S = env.float("TESSERA_WATCHDOG_INTERVAL_S", default=5.0)
# Engine profile parameters to override, as JSON, e.g. {"min_runtime_s": 60} (docs/engine.md lists them).
TESSERA_SCHEDULER_PARAMS = env.json("TESSERA_SCHEDULER_PARAMS", default={})
# /metrics (portal/metrics.py): a bearer token, or client addresses allowed without one.
TESSERA_METRICS_TOKEN = env.str("TESSERA_METRICS_TOKEN", default="")
TESSERA_METRICS_ALLOW_NETWORKS = env.list(
    "TESSERA_METRICS_ALLOW_NETWORKS", default=["127.0.0.1/32", "::1/128"]
)
# Where the site runs Prometheus (scraping /metrics), the node page reads GPU history from it; else from the
# portal's own rollups.
PROMETHEUS_URL = env.str("PROMETHEUS_URL", default="")
# Notifications (scheduling/notifications): email through Django's backend, SMTP from EMAIL_URL
# (smtp+tls://user:password@host:587); the console (the process's output) when unset, as in the demo.
globals().update(env.email_url("EMAIL_URL", default="consolemail://"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="tessera@localhost")
# The portal's address as people reach it, for links in notifications (empty: paths only).
TESSERA_PUBLIC_URL = env.str("TESSERA_PUBLIC_URL", default="")
# A Slack-compatible webhook told of lost nodes and GPU XID errors, besides the staff who asked.
TESSERA_NOTIFY_ADMIN_WEBHOOK_URL = env.str("TESSERA_NOTIFY_ADMIN_WEBHOOK_URL", default="")
# Host names, addresses and networks (chat.internal, 10.20.0.0/16) users' webhooks may reach although not public,
# and over plain http; anything else must be https to a public address (scheduling/notifications/webhooks.py).
TESSERA_WEBHOOK_ALLOW_HOSTS = env.list("TESSERA_WEBHOOK_ALLOW_HOSTS", default=[])
# A running job's log stream that brought nothing new is asked again after a doubling wait up to this (s).
TESSERA_LOG_QUIET_MAX_S = env.float("TESSERA_LOG_QUIET_MAX_S", default=10.0)
# A quiet stream nobody watches is asked every this many seconds (its end is always drained): at 8,000 running
# jobs, one minute was 270 asks a second through the agents' daphnes, more than their heartbeats.
TESSERA_LOG_UNWATCHED_MAX_S = env.float("TESSERA_LOG_UNWATCHED_MAX_S", default=300.0)
# History (scheduling/history): rollups each minute, kept this many days (docs/operations.md, "History").
TESSERA_HISTORY_RETENTION_DAYS = env.int("TESSERA_HISTORY_RETENTION_DAYS", default=30)
TESSERA_HISTORY_INTERVAL_S = env.float("TESSERA_HISTORY_INTERVAL_S", default=60.0)
# Idle GPUs given back (scheduling/cycle/idle.py): how often jobs' idle clocks are checked, and how long before its
# GPUs are given back a job is warned (at half its timeout when that is shorter).
TESSERA_IDLE_CHECK_INTERVAL_S = env.float("TESSERA_IDLE_CHECK_INTERVAL_S", default=30.0)
TESSERA_IDLE_WARN_BEFORE_S = env.float("TESSERA_IDLE_WARN_BEFORE_S", default=600.0)
# A batch job requeued for idleness is held out of the queue this long after its grace: the work that waited goes
# first.
TESSERA_IDLE_REQUEUE_HOLD_S = env.float("TESSERA_IDLE_REQUEUE_HOLD_S", default=600.0)
# Sessions' proxy (frontend/sessions.py) goes only to nodes' addresses in these networks (CIDRs; empty: any address
# but link-local, multicast, unspecified and reserved ones), and to loopback only when allowed (a node on the
# portal's own host, as in the demo): a node's agent names its address, and must not point the proxy at the portal's
# own services or a cloud's metadata address.
TESSERA_SESSION_NETWORKS = env.list("TESSERA_SESSION_NETWORKS", default=[])
TESSERA_SESSION_ALLOW_LOOPBACK = env.bool("TESSERA_SESSION_ALLOW_LOOPBACK", default=False)
# Beat must run once; both tasks are safe to run twice anyway (RELIABILITY.md, "two beats").
CELERY_BEAT_SCHEDULE = {
    "scheduling-cycle": {"task": "scheduling.tasks.cycle_tick", "schedule": TESSERA_CYCLE_INTERVAL_S},
    "node-watchdog": {"task": "scheduling.tasks.node_watchdog_task", "schedule": TESSERA_WATCHDOG_INTERVAL_S},
    "history-record": {
        "task": "scheduling.tasks.history_record_task",
        "schedule": TESSERA_HISTORY_INTERVAL_S,
    },
    "history-usage": {"task": "scheduling.tasks.history_usage_task", "schedule": 300.0},
    "history-maintain": {"task": "scheduling.tasks.history_maintain_task", "schedule": 3600.0},
    "notifications-due": {"task": "scheduling.tasks.notifications_due_task", "schedule": 30.0},
    "idle-check": {"task": "scheduling.tasks.idle_check_task", "schedule": TESSERA_IDLE_CHECK_INTERVAL_S},
}

# --- Auth, API --------------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    # Refuses nothing: on every change of a password it ends the user's sessions and revokes their tokens.
    {"NAME": "quotas.sign_out.SignOutOnPasswordChange"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/jobs/"
LOGOUT_REDIRECT_URL = "/"
AUTHENTICATION_BACKENDS = [
    # Refuses a locked-out username from an address before the password is even checked (django-axes).
    "frontend.auth.SignInProtectionBackend",
    # Local accounts (passwords kept here): everyone's, or with TESSERA_LOCAL_SIGN_IN=superusers only the
    # break-glass admins', where people sign in through the site's directory.
    "frontend.auth.LocalAccountBackend",
]
LOCAL_SIGN_IN = env.str("TESSERA_LOCAL_SIGN_IN", default="everyone")
if LOCAL_SIGN_IN not in ("everyone", "superusers"):
    raise ImproperlyConfigured(
        f"TESSERA_LOCAL_SIGN_IN must be everyone or superusers (got {LOCAL_SIGN_IN!r})"
    )
# Sign-in through the site's directory (docs/operations.md, "Sign-in"): teams follow its groups (each team names
# its groups), and staff status follows this group's membership (empty: staff is set by hand).
DIRECTORY_STAFF_GROUP = env.str("TESSERA_DIRECTORY_STAFF_GROUP", default="")
# OpenID Connect (quotas/oidc.py, mozilla-django-oidc): set, TESSERA_OIDC_CLIENT_ID turns it on. The endpoints are
# the provider's discovery document's (`<issuer>/.well-known/openid-configuration`).
OIDC_PROVIDER_NAME = env.str("TESSERA_OIDC_PROVIDER_NAME", default="single sign-on")
OIDC_RP_CLIENT_ID = env.str("TESSERA_OIDC_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET = env.str("TESSERA_OIDC_CLIENT_SECRET", default="")
OIDC_OP_AUTHORIZATION_ENDPOINT = env.str("TESSERA_OIDC_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = env.str("TESSERA_OIDC_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT = env.str("TESSERA_OIDC_USERINFO_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = env.str("TESSERA_OIDC_JWKS_URI", default="")
OIDC_RP_SIGN_ALGO = env.str("TESSERA_OIDC_SIGN_ALGO", default="RS256")
OIDC_RP_SCOPES = env.str("TESSERA_OIDC_SCOPES", default="openid profile email")
OIDC_USE_PKCE = True
OIDC_TIMEOUT = env.float("TESSERA_OIDC_TIMEOUT_S", default=10.0)
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=failed"
TESSERA_OIDC_ISSUER = env.str("TESSERA_OIDC_ISSUER", default="")
TESSERA_OIDC_USERNAME_CLAIM = env.str("TESSERA_OIDC_USERNAME_CLAIM", default="preferred_username")
TESSERA_OIDC_GROUPS_CLAIM = env.str("TESSERA_OIDC_GROUPS_CLAIM", default="groups")
TESSERA_OIDC_UNIX_ACCOUNT_CLAIM = env.str("TESSERA_OIDC_UNIX_ACCOUNT_CLAIM", default="")
# `tessera login --sso`: the device flow, with a public client of the provider's for the CLI.
TESSERA_OIDC_DEVICE_AUTHORIZATION_ENDPOINT = env.str("TESSERA_OIDC_DEVICE_AUTHORIZATION_ENDPOINT", default="")
TESSERA_OIDC_CLI_CLIENT_ID = env.str("TESSERA_OIDC_CLI_CLIENT_ID", default="")
# For a provider whose device flow gives no ID token: the CLI's access token is checked there (RFC 7662).
TESSERA_OIDC_INTROSPECTION_ENDPOINT = env.str("TESSERA_OIDC_INTROSPECTION_ENDPOINT", default="")
if OIDC_RP_CLIENT_ID:
    AUTHENTICATION_BACKENDS.insert(1, "quotas.oidc.DirectoryOIDCBackend")
LDAP_URI = env.str("TESSERA_LDAP_URI", default="")
if LDAP_URI:
    from quotas.ldap_settings import ldap_settings

    globals().update(ldap_settings(env))
    AUTHENTICATION_BACKENDS.insert(1, "quotas.ldap.DirectoryLDAPBackend")
# Brute-force protection of every password form (the portal's sign-in, the admin's, the API's token login):
# after AXES_FAILURE_LIMIT wrong passwords for one username from one address, that pair is refused for
# AXES_COOLOFF_MINUTES; a right password resets the count.
AXES_ENABLED = env.bool("AXES_ENABLED", default=True)
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.float("AXES_COOLOFF_MINUTES", default=15.0) / 60
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "frontend.auth.lockout_response"
AXES_VERBOSE = False
AXES_CLIENT_IP_CALLABLE = "portal.client_address.client_address"
# Addresses (or networks) of the reverse proxies in front of the portal. Only their X-Forwarded-For is believed
# (portal/client_address.py); empty: no proxy, REMOTE_ADDR is the client.
TRUSTED_PROXIES = env.list("TRUSTED_PROXIES", default=[])
# The submit form's what-if preview per user (it runs the engine on each call), throttled as API submits are.
TESSERA_PREVIEW_RATE = env.str("TESSERA_PREVIEW_RATE", default="60/min")

REST_FRAMEWORK = {
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # Bearer first: unauthenticated requests then get 401 with WWW-Authenticate, not 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "quotas.api.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_SCHEMA_CLASS": "portal.api_schema.TesseraAutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["portal.api_params.FilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "portal.api_support.BoundedPagination",
    "DEFAULT_PARSER_CLASSES": [
        "portal.parsers.SafeJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    # Refuses a body over the API's limit by its Content-Length before any parser reads it.
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "portal.parsers.BoundedBodyNegotiation",
    "EXCEPTION_HANDLER": "portal.api_support.exception_handler",
    "DEFAULT_THROTTLE_RATES": {"submit": env.str("TESSERA_API_SUBMIT_RATE", default="120/min")},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tessera API",
    "DESCRIPTION": "Submit GPU jobs, watch the queue and the cluster, manage tokens.",
    "VERSION": "1",
    # The docs pages load their JavaScript from drf-spectacular-sidecar: no CDN, works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "scheduling.choices.JobState",
        "JobKindEnum": "scheduling.choices.JobKind",
    },
}
# Browser websockets open at once (scheduling/realtime/sockets.py): per user, and per signed-in session.
TESSERA_MAX_SOCKETS_PER_USER = env.int("TESSERA_MAX_SOCKETS_PER_USER", default=64)
TESSERA_MAX_SOCKETS_PER_SESSION = env.int("TESSERA_MAX_SOCKETS_PER_SESSION", default=32)
# Job logs shipped by agents (scheduling.joblogs).
TESSERA_LOG_DIR = env.str("TESSERA_LOG_DIR", default=str(VAR_DIR / "logs"))

# --- Security (production) --------------------------------------------------------------------------------
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env.bool("BEHIND_TLS_PROXY", False) else None

# --- Static files, i18n -----------------------------------------------------------------------------------
STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(VAR_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve app static files straight from their folders when collectstatic has not run (the embedded demo).
WHITENOISE_USE_FINDERS = env.bool("WHITENOISE_USE_FINDERS", default=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# One format for the portal, the Celery worker and beat (portal/celery.py) and the agent (agent/logformat.py):
# timestamp (UTC), level, logger and the request id / job id / node where they apply; LOG_FORMAT=json writes one
# JSON object per line. docs/operations.md, "Logs".
LOG_FORMAT = env.str("LOG_FORMAT", default="text").strip().lower()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "context": {"()": "agent.logformat.ContextFilter"},
        "refusal_without_traceback": {"()": "portal.log_filters.RefusalWithoutTraceback"},
    },
    "formatters": {
        "tessera": {
            "()": "agent.logformat.JsonFormatter" if LOG_FORMAT == "json" else "agent.logformat.TextFormatter"
        }
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "tessera", "filters": ["context"]}
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        # Django's default config gives `django` a console handler of its own under DEBUG: with the root's, every
        # line would be written twice. Its records go to the root's handler only.
        "django": {"handlers": [], "propagate": True},
        "django.server": {"handlers": [], "propagate": True},
        # A 4xx the portal meant (a 403 for PermissionDenied) keeps its warning line but not the traceback.
        "django.request": {"filters": ["refusal_without_traceback"]},
        # django-axes logs every sign-in at INFO; lockouts (WARNING) are what an operator needs.
        "axes": {"level": "WARNING"},
    },
}
