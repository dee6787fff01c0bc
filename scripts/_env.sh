# Sourced by the entry points in scripts/: the project's one virtual
# environment (.venv, Python 3.11), installed from constraints.txt.
#   ensure_env build   light: build frontend, setuptools, wheel, rich, pytest
#   ensure_env test    + tensorflow-cpu, jax, torch (CPU), ruff
# A stamp (hash of the inputs) skips pip when nothing changed.
# KERAS_FORK_VENV names another environment folder: scripts/test builds first
# from one made from requirements/build.txt alone (build/venv, git-ignored
# with the other build outputs), so that a build dependency missing from
# build.txt fails CI (issue 37).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KERAS_FORK_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

ensure_env() {
  local group="$1"
  local stamp="$VENV/.stamp-$group"
  local want
  want=$(cat "$ROOT/constraints.txt" "$ROOT"/requirements/*.txt | sha256sum | cut -c1-16)
  if [ ! -x "$PY" ]; then
    local interp
    interp=$(command -v python3.11 || command -v python3)
    "$interp" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
      || { echo "error: Python 3.11 is required" >&2; return 2; }
    "$interp" -m venv "$VENV"
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing the $group environment into ${VENV#"$ROOT"/} ..." >&2
    "$PY" -m pip install -q --disable-pip-version-check \
      -c "$ROOT/constraints.txt" -r "$ROOT/requirements/$group.txt" 2> >(grep -v "is ignored: it is neither" >&2)
    if [ "$group" = test ]; then
      # tensorflow pulls PyPI keras in; the variants (stock, fork) each bring
      # their own keras on PYTHONPATH, so none may sit in site-packages.
      "$PY" -m pip uninstall -y -q keras 2>/dev/null || true
    fi
    echo "$want" > "$stamp"
  fi
}
