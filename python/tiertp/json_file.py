"""Reading a JSON object from a file the user names, or from the file of a
given name in the folder they name, with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_object(path: Path, file_name: str, what: str, missing_hint: str) -> tuple[dict, Path]:
    """The object in `path` (or in `path / file_name` when `path` is a
    folder) and the file it came from; FileNotFoundError with
    `missing_hint` when there is no such file, ValueError when it is not
    JSON or not a JSON object (`what` names the file's kind)."""
    file = path / file_name if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such file ({missing_hint})")
    try:
        doc = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{file}: {what} holds a JSON object, this holds {type(doc).__name__}")
    return doc, file
