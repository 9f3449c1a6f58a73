"""Settings of the demo and test project. Configure through the environment:

``DATABASE_URL``: defaults to an SQLite file beside this project; set e.g.
``postgres://postgres@127.0.0.1:5432/inbox`` to run on PostgreSQL.
"""

import importlib.util
from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env("SECRET_KEY", default="demo-only-not-secret")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_inbox",
    "django_inbox.outbox",
    "shop",
    "effects",
]
# django-celery-beat's tables, for the test of the inbox's PeriodicTask rows (the test extras
# install it; the demo runs without). It imports Celery itself: INBOX_TEST_CELERY_BEAT=0 leaves
# it out, for the test that the inbox's own modules do not.
if importlib.util.find_spec("django_celery_beat") is not None and env.bool(
    "INBOX_TEST_CELERY_BEAT", default=True
):
    INSTALLED_APPS.append("django_celery_beat")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # One writer at a time: take the write lock when a transaction begins (Django 5.1+) and
    # wait for it instead of failing, so a worker's claim never races another writer.
    options = DATABASES["default"].setdefault("OPTIONS", {})
    options.setdefault("timeout", 30)
    if django.VERSION >= (5, 1):
        options.setdefault("transaction_mode", "IMMEDIATE")

# Behind a pooler in transaction mode (the PgBouncer tests): what the "Running at scale" how-to
# asks for.
if env.bool("INBOX_TEST_POOLED", default=False):
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    INBOX_PREPARED_STATEMENTS = False

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

INBOX_CONSUMERS = {
    # The demo's consumers retry quickly so the demo finishes in seconds. The payment
    # gateway is flaky; the inventory gets the odd malformed message.
    "inventory": {"max_attempts": 4, "backoff_base": 0.05, "backoff_max": 0.2},
    "payments": {"max_attempts": 4, "backoff_base": 0.05, "backoff_max": 0.2},
    # Test consumers: short leases so crash tests see dead workers' rows come back quickly.
    "stream": {"backoff_base": 0.05, "backoff_max": 0.5, "lease": 2.0},
    # The ordered consumer's tests: versions per key, gaps parked after ORDERED_GAP_TIMEOUT.
    "ordered": {
        "ordered": True,
        "gap_timeout": env("ORDERED_GAP_TIMEOUT", default="10m"),
        "max_attempts": 3,
        "backoff_base": 0.01,
        "backoff_max": 0.05,
        "lease": 5.0,
    },
    # Re-runs: "notify" suppresses side effects on re-runs, "effects" runs them (the default);
    # "projection" is an ordered projection rebuilt by re-runs.
    "notify": {"side_effects_on_rerun": "suppress", "max_attempts": 3, "backoff_base": 0.01},
    "projection": {
        "ordered": True,
        "side_effects_on_rerun": "suppress",
        "max_attempts": 3,
        "backoff_base": 0.01,
        "backoff_max": 0.05,
    },
    # @inbox_task tasks (testproject/effects/tasks.py).
    "tasks": {
        "max_attempts": env.int("TASKS_MAX_ATTEMPTS", default=3),
        "backoff_base": 0.01,
        "backoff_max": 0.05,
        "lease": env.float("TASKS_LEASE", default=2.0),
    },
    "effects": {
        # A chaos test that kills workers N times raises it above N: a row killed in every
        # attempt would end dead, and the test would count it lost.
        "max_attempts": env.int("EFFECTS_MAX_ATTEMPTS", default=3),
        "backoff_base": 0.01,
        "backoff_max": 0.05,
        "lease": env.float("EFFECTS_LEASE", default=2.0),
    },
}

# The embedded broker for the demo: kombu's filesystem transport, messages as files under
# testproject/broker/. Point INBOX_BROKER_URL at RabbitMQ or Redis for the real thing.
INBOX_BROKER_URL = env("INBOX_BROKER_URL", default="filesystem://")
_BROKER_DIR = BASE_DIR / "broker"
INBOX_BROKER_TRANSPORT_OPTIONS = env.json(
    "INBOX_BROKER_TRANSPORT_OPTIONS",
    default=(
        {
            "data_folder_in": str(_BROKER_DIR / "messages"),
            "data_folder_out": str(_BROKER_DIR / "messages"),
            "control_folder": str(_BROKER_DIR / "control"),
        }
        if INBOX_BROKER_URL.startswith("filesystem")
        else {}
    ),
)
INBOX_BROKER_HEARTBEAT = env.int("INBOX_BROKER_HEARTBEAT", default=0)
INBOX_MAX_PAYLOAD_BYTES = env.int("INBOX_MAX_PAYLOAD_BYTES", default=1024 * 1024)
# The outbox's relays: the chaos tests shorten the lease so killed relays' rows come back soon.
INBOX_OUTBOX_LEASE = env.float("OUTBOX_LEASE", default=60.0)
INBOX_OUTBOX_CONFIRM_TIMEOUT = min(10.0, INBOX_OUTBOX_LEASE / 2)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_inbox": {"handlers": ["console"], "level": env("INBOX_LOG_LEVEL", default="ERROR")}
    },
}

# Celery (only when it is installed: the demo does not need it). The beat schedule is set in
# testproject/celery.py, not here: every manage.py command reads these settings, and Celery
# would cost each of them (inbox_consume, inbox_process) 7 MiB and its import time.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/5")
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND", default=CELERY_BROKER_URL)
# On Redis, a killed worker's unacknowledged tasks come back after the visibility timeout
# (an hour by default); the inbox task tests shorten it.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.float("CELERY_VISIBILITY_TIMEOUT", default=3600.0)
}
CELERY_TASK_DEFAULT_QUEUE = env("CELERY_TASK_DEFAULT_QUEUE", default="inbox")

# Tests of clock skew run a process whose clock is off by this many seconds (ahead if
# positive): Django's clock, which the inbox reads, is shifted; the database's is not.
CLOCK_SKEW = env.float("INBOX_TEST_CLOCK_SKEW", default=0.0)
if CLOCK_SKEW:
    import datetime as _datetime

    from django.utils import timezone as _timezone

    _skew = _datetime.timedelta(seconds=CLOCK_SKEW)
    _real_now = _timezone.now
    _timezone.now = lambda: _real_now() + _skew
