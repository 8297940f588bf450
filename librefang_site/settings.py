"""Settings, all driven by environment variables so `make run`, tests and CI share one file."""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
LIBREFANG_HOME = Path(os.environ.get("LIBREFANG_HOME", Path.home() / ".librefang")).expanduser()

# $LIBREFANG_HOME holds secrets (the secret key, tokens, the database with session keys): everything a process of
# ours creates is owner-only. Every process (daphne, workers, manage.py commands) imports these settings first.
os.umask(0o077)


def _owner_only(home: Path) -> None:
    """Tighten a home created before the umask (or by hand): the directory 0700, the database files 0600."""
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        if home.stat().st_uid == os.getuid() and home.stat().st_mode & 0o077:
            home.chmod(0o700)
        for name in ("librefang.sqlite3", "librefang.sqlite3-wal", "librefang.sqlite3-shm"):
            path = home / name
            if path.exists() and path.stat().st_mode & 0o077:
                path.chmod(0o600)
    except OSError:
        pass  # a read-only or foreign home: the service reports what it cannot use later, with context


_owner_only(LIBREFANG_HOME)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    # A per-home secret, created once, so sessions survive restarts without a hard-coded key.
    _key_file = LIBREFANG_HOME / "secret_key"
    try:
        SECRET_KEY = _key_file.read_text().strip()
    except OSError:
        import secrets

        SECRET_KEY = secrets.token_urlsafe(50)
        try:
            LIBREFANG_HOME.mkdir(parents=True, exist_ok=True)
            _key_file.write_text(SECRET_KEY)
            _key_file.chmod(0o600)
        except OSError:
            pass

DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver").split(",")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "axes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "channels",
    "ninja",  # /api/docs from its own static files (Swagger UI), not a CDN
    "plugins_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "plugins_app.middleware.ContentSecurityPolicy",
    "plugins_app.middleware.DatabaseDownPage",
    "axes.middleware.AxesMiddleware",  # last, as django-axes requires: turns a refused login into the lockout page
]

# ---- login throttling (django-axes) ----
# Failed logins are counted per username + client address; at the limit that pair is refused for the cool-off,
# even with the right password. The address is the TCP peer: X-Forwarded-For is read only when the peer is one of
# LIBREFANG_TRUSTED_PROXIES (comma-separated addresses or networks), see plugins_app/views/login.py.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out username + address before any password check
    "django.contrib.auth.backends.ModelBackend",
]
LIBREFANG_TRUSTED_PROXIES = [p.strip() for p in os.environ.get("LIBREFANG_TRUSTED_PROXIES", "").split(",") if p.strip()]
AXES_FAILURE_LIMIT = int(os.environ.get("LIBREFANG_LOGIN_FAILURE_LIMIT", "10"))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("LIBREFANG_LOGIN_LOCKOUT_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "plugins_app.views.login.client_ip"
AXES_LOCKOUT_CALLABLE = "plugins_app.views.login.locked_out"
AXES_ENABLE_ADMIN = False
AXES_VERBOSE = False

ROOT_URLCONF = "librefang_site.urls"
ASGI_APPLICATION = "librefang_site.asgi.application"

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
                "plugins_app.context_processors.sandbox_state",
                "plugins_app.context_processors.service_state",
            ],
        },
    },
]


_sqlite_options = {
    # WAL + a busy timeout: web tier and several workers write the same file.
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
}
if os.environ.get("DATABASE_URL"):
    # postgres://user:pass@host:5432/db (psycopg comes with the `.[postgres]` extra) or sqlite:////abs/path.
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"])}
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        DATABASES["default"]["CONN_MAX_AGE"] = 60
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("LIBREFANG_DB", str(LIBREFANG_HOME / "librefang.sqlite3")),
        }
    }
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["OPTIONS"] = _sqlite_options
    DATABASES["default"].setdefault("TEST", {})["NAME"] = os.environ.get("LIBREFANG_TEST_DB") or None

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = LIBREFANG_HOME / "staticfiles"
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# Every Redis key and channel-layer group of this installation starts with this prefix, so several
# installations (and parallel test runs) can share one Redis.
LIBREFANG_REDIS_PREFIX = os.environ.get("LIBREFANG_REDIS_PREFIX", "librefang")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # channels_redis blocks 5 s in BZPOPMIN; redis-py 8's default 5 s socket timeout would race it and
            # kill consumers with "Timeout reading from …", so reads get a longer timeout.
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}],
            "prefix": f"{LIBREFANG_REDIS_PREFIX}:asgi",
            "capacity": 2000,
            "expiry": 30,
        },
    }
}

# Body size limit for API requests (bytes); oversized bodies get 413 with the JSON error envelope.
LIBREFANG_MAX_BODY_BYTES = int(os.environ.get("LIBREFANG_MAX_BODY_BYTES", str(4 * 1024 * 1024)))
DATA_UPLOAD_MAX_MEMORY_SIZE = LIBREFANG_MAX_BODY_BYTES

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LIBREFANG_LOG_LEVEL", "WARNING")},
    "loggers": {
        "librefang": {"level": os.environ.get("LIBREFANG_LOG_LEVEL", "INFO")},
        "plugin_stderr": {"level": os.environ.get("LIBREFANG_STDERR_LOG_LEVEL", "WARNING")},
        "python_stderr": {"level": os.environ.get("LIBREFANG_STDERR_LOG_LEVEL", "WARNING")},
    },
}
