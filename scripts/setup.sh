#!/usr/bin/env bash
# Creates .venv with the pinned Python deps and builds the Rust extension in
# release mode. Idempotent: the pip steps are skipped while requirements are
# unchanged; cargo rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
stamp="$VENV/.requirements.sha"
want=$(cat requirements/*.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade "pip>=24,<26"
    "$VENV/bin/python" -m pip install --quiet -r requirements/python.txt
    if grep -qvE '^\s*(#|$)' requirements/no-deps.txt; then
        "$VENV/bin/python" -m pip install --quiet --no-deps -r requirements/no-deps.txt
    fi
    # The lint tools (pyproject.toml's `dev` extra), without building the package for them.
    mapfile -t dev < <("$VENV/bin/python" -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]))')
    "$VENV/bin/python" -m pip install --quiet "${dev[@]}"
    echo "$want" > "$stamp"
fi
VIRTUAL_ENV="$PWD/$VENV" PATH="$PWD/$VENV/bin:$PATH" "$VENV/bin/maturin" develop --release --quiet
