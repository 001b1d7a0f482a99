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
    "$VENV/bin/python" -m pip install --quiet -r requirements/installer.txt
    # Hard links into uv's cache, not copies: torch and the CUDA wheels are
    # ~6 GB, and a second copy of them filled the disk of a CI host whose uv
    # cache was warm. Nothing writes into site-packages' files in place; where
    # the cache is on another filesystem uv copies instead.
    # Bytecode compiled now, as pip does: with PYTHONDONTWRITEBYTECODE set no
    # process writes it later, and every SGLang, torch or transformers import
    # in every rank, engine and test process would compile them again.
    install=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --link-mode=hardlink --compile-bytecode)
    if [ -n "${PIP_FIND_LINKS:-}" ]; then
        install+=(--find-links "$PIP_FIND_LINKS")
    fi
    # pip stays in the venv for maturin, which installs the package with it.
    "${install[@]}" "pip>=24,<26"
    "${install[@]}" -r requirements/python.txt
    if grep -qvE '^\s*(#|$)' requirements/no-deps.txt; then
        "${install[@]}" --no-deps -r requirements/no-deps.txt
    fi
    # The lint tools (pyproject.toml's `dev` extra), without building the package for them.
    mapfile -t dev < <("$VENV/bin/python" -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]))')
    "${install[@]}" "${dev[@]}"
    echo "$want" > "$stamp"
    rm -f "$VENV/.tiertp-installed"
fi
# Once the package is installed (editable), only the extension needs
# rebuilding: `--skip-install` keeps pip out of it, so a warm `make run`
# prints nothing from pip.
skip=()
if [ -f "$VENV/.tiertp-installed" ] && [ -x "$VENV/bin/tiertp" ]; then
    skip=(--skip-install)
fi
develop() {
    VIRTUAL_ENV="$PWD/$VENV" PATH="$PWD/$VENV/bin:$PATH" "$VENV/bin/maturin" develop --release --quiet "${skip[@]}"
}
if [ ${#skip[@]} -eq 0 ]; then
    develop
else
    # Warm: the build's progress lines are shown only when it fails.
    log=$(mktemp)
    if ! develop >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "setup: building the Rust extension failed (output above)" >&2
        exit 1
    fi
    rm -f "$log"
fi
touch "$VENV/.tiertp-installed"
