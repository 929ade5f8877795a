# Shared by scripts/run and scripts/test: a project virtualenv with what the project needs.
# Sourced, not executed. EXTRAS names the pyproject extras to install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "Python 3.11 or newer is needed (found: $("$PYTHON" --version 2>&1))." >&2
  exit 1
fi
VENV="${VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtualenv in $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
fi

# Reinstall only when pyproject.toml or the extras changed.
stamp="$VENV/.orbitpilot-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) ${EXTRAS}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing orbitpilot-dashboard${EXTRAS:+[$EXTRAS]}"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".${EXTRAS:+[$EXTRAS]}"
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
export FLASK_APP=wsgi.py
