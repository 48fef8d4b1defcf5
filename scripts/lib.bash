# Shared by scripts/run-example and scripts/test (sourced, not run).
# Makes .venv at the repository root and installs the package with its dev extras into it,
# skipping the install when nothing it depends on has changed since the last one.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

say() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

ensure_venv() {
    if [ ! -x "$PY" ]; then
        local python="${PYTHON:-python3}"
        command -v "$python" >/dev/null || die "$python not found; install Python 3.11 or newer (or set PYTHON=...)"
        say "creating $VENV"
        "$python" -m venv "$VENV" ||
            die "could not create the virtualenv (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        die "$VENV runs Python $("$PY" -c 'import platform; print(platform.python_version())'); 3.11 or newer is needed (remove .venv and set PYTHON=python3.11)"
    # The stamp records pyproject.toml as installed; -I keeps the working directory off
    # sys.path, so the import below finds the installed package, not the source tree.
    local stamp="$VENV/.django-weft-dev-installed" want
    want=$(cd "$ROOT" && "$PY" -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
    if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] &&
        (cd / && "$PY" -I -c 'import django_weft, django, pytest_django, psycopg, mypy, ruff, rest_framework, drf_spectacular, schemathesis, importlinter, selenium, mkdocs, material, mkdocstrings_handlers.python') 2>/dev/null; then
        return 0
    fi
    say "installing django-weft with its dev extras into $VENV"
    local log="$VENV/pip-install.log"
    if ! (cd "$ROOT" && "$PY" -m pip install --disable-pip-version-check -e ".[dev]") >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "pip install -e .[dev] failed; the whole output is in $log"
    fi
    printf '%s\n' "$want" >"$stamp"
}
