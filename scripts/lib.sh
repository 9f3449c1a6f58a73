# Helpers shared by scripts/demo and scripts/test.

step() { printf '\n==> %s\n' "$*"; }

# ensure_venv EXTRAS: create .venv with the newest Python 3.11+ found and install the project.
ensure_venv() {
    local extras="$1"
    if [ ! -x .venv/bin/python ]; then
        local py=""
        for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
            [ -n "$candidate" ] || continue
            if command -v "$candidate" >/dev/null 2>&1 &&
                "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
                py="$candidate"
                break
            fi
        done
        [ -n "$py" ] || { echo "Python 3.11 or newer is needed" >&2; exit 2; }
        step "creating .venv with $("$py" --version)"
        "$py" -m venv .venv
    fi
    step "installing django-transactional-inbox$extras into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$extras"
}

ensure_postgres() {
    if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
        return
    fi
    step "starting PostgreSQL"
    if command -v pg_ctlcluster >/dev/null 2>&1; then
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
    fi
    for _ in $(seq 1 30); do
        pg_isready -q -h 127.0.0.1 -p 5432 && return
        sleep 1
    done
    echo "PostgreSQL is not reachable on 127.0.0.1:5432" >&2
    exit 2
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for_port() {
    local port="$1" name="$2"
    for _ in $(seq 1 60); do
        port_open "$port" && return
        sleep 1
    done
    echo "$name is not reachable on 127.0.0.1:$port" >&2
    exit 2
}

# The broker tests talk to the real RabbitMQ and Redis on this machine; start them if down.
ensure_redis() {
    port_open 6379 && return
    step "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
        --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
    wait_for_port 6379 Redis
}

ensure_rabbitmq() {
    port_open 5672 && return
    step "starting RabbitMQ"
    rabbitmq-server -detached
    wait_for_port 5672 RabbitMQ
    rabbitmqctl await_startup >/dev/null 2>&1 || true
}

ensure_nats() {
    port_open 4222 && return
    step "starting NATS (JetStream)"
    [ -x /usr/sbin/nats-server ] || apt-get install -y -q nats-server >/dev/null
    mkdir -p /var/lib/nats-server
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
        -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
    wait_for_port 4222 NATS
}

# ensure_database: create the database DATABASE_URL names, on PostgreSQL, if it does not exist
# (nothing else needs it: pytest makes test_<name>, but makemigrations --check reads its
# migration history).
ensure_database() {
    PYTHONPATH=testproject DJANGO_SETTINGS_MODULE=testproject.settings .venv/bin/python - <<'PY'
import django

django.setup()
from django.db import OperationalError, connection

if connection.vendor == "postgresql":
    try:
        connection.ensure_connection()
    except OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
        name = connection.settings_dict["NAME"]
        with connection._nodb_cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
        print(f"created database {name}")
PY
}

# makemigrations_check: fail if a model change has no migration. A warning is an error: one
# that the migration history could not be read would otherwise pass unseen.
makemigrations_check() {
    ensure_database &&
        .venv/bin/python -W error::RuntimeWarning testproject/manage.py makemigrations --check --dry-run
}

# The admin's browser tests drive Debian's Chromium through Playwright (never `playwright
# install`: its browser builds are downloaded from elsewhere). Install it when it is missing.
ensure_chromium() {
    [ -x /usr/bin/chromium ] && return
    step "installing Chromium (Debian package)"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
}

# MariaDB: the migrations are proven on it (tests/system/test_mariadb_migrations.py). The
# driver, mysqlclient, compiles against Debian's client headers: install them before the
# project; start the server if it is down.
ensure_mariadb_client() {
    [ -f /usr/include/mariadb/mysql.h ] && return
    step "installing MariaDB's client headers (Debian package libmariadb-dev)"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libmariadb-dev pkg-config
}

# PgBouncer (Debian's package; the tests start their own, on a port of their own, in front
# of the machine's PostgreSQL): the inbox is proven behind it in transaction mode.
ensure_pgbouncer() {
    [ -x /usr/sbin/pgbouncer ] && return
    step "installing PgBouncer (Debian package)"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends pgbouncer
}

ensure_mariadb() {
    port_open 3306 && return
    step "starting MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
    wait_for_port 3306 MariaDB
}

# find_python VERSION: an interpreter of Python VERSION (3.12) that runs: one of pyenv's, or one
# on PATH (a pyenv shim on PATH fails when that version is not selected: it is tried, not
# trusted).
find_python() {
    local version="$1" candidate
    for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/"python$version" \
        "$(command -v "python$version" 2>/dev/null)"; do
        [ -n "$candidate" ] && [ -x "$candidate" ] || continue
        if "$candidate" -c 'import sys' >/dev/null 2>&1; then
            echo "$candidate"
            return
        fi
    done
    echo "Python $version is not installed (not in pyenv, none on PATH runs)" >&2
    return 1
}

# matrix_venv VERSION DJANGO: .venv-pyVERSION with Python VERSION, the project's test extras and
# Django DJANGO ("5.2": the newest 5.2.x), for the matrix's fast subset.
matrix_venv() {
    local version="$1" django="$2" python dir=".venv-py$1"
    python="$(find_python "$version")" || return 1
    [ -x "$dir/bin/python" ] || "$python" -m venv "$dir" || return 1
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip &&
        "$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
            -e ".[test,celery,prometheus]" "django~=$django.0"
}

# phase NAME COMMAND…: run a phase of a script, print its time, remember how it ended.
PHASES=()
FAILED=0
phase() {
    local name="$1"
    shift
    step "$name"
    local started=$SECONDS
    "$@"
    local code=$?
    local took=$((SECONDS - started))
    local verdict="ok"
    if [ "$code" -ne 0 ]; then
        verdict="FAILED (exit $code)"
        FAILED=1
    fi
    printf -- '--- %s: %s in %dm%02ds\n' "$name" "$verdict" $((took / 60)) $((took % 60))
    PHASES+=("$(printf '%-12s %6s  %s' "$verdict" "$((took / 60))m$(printf '%02d' $((took % 60)))s" "$name")")
}

# summary: print every phase's result and time; exit 1 if any failed.
summary() {
    step "summary (${SECONDS}s in all)"
    printf '  %s\n' "${PHASES[@]}"
    exit "$FAILED"
}
