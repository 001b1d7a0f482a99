"""Control-plane key files (`tiertp keys`): the 32-byte key as 64 lowercase
hex digits and a newline, readable and writable by its owner only (mode
0600). The gateway and every agent of a cluster are given the same file.

Loading checks the mode (a key others can read protects nothing) and the
format; the errors name the file, never its content.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tiertp.worker.seal import KEY_BYTES, ControlKey

_HEX_DIGITS = 2 * KEY_BYTES


class KeyFileError(ValueError):
    """A key file that cannot be used, named, with what to do."""


def write_key_file(path: Path, force: bool = False) -> None:
    """A new random key in `path`, created with mode 0600; KeyFileError if it
    exists, unless `force` (then it is replaced whole, never written in place)."""
    path = Path(path)
    if path.exists() and not force:
        raise KeyFileError(f"{path} exists; not overwritten (--force replaces it, and every node then needs the "
                           "new file)")
    text = ControlKey.generate().raw.hex() + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise KeyFileError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_key_file(path: Path) -> ControlKey:
    """The key in `path`; KeyFileError if it is missing, readable by group or
    others, or not one key."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise KeyFileError(f"control-plane key file {path}: {e.strerror or e} (`tiertp keys {path}` makes one)") \
            from None
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"control-plane key file {path}: not a regular file")
    if st.st_mode & 0o077:
        raise KeyFileError(f"control-plane key file {path}: group or others may access it (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}); a key others can read protects nothing: "
                           f"chmod 600 {path}")
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise KeyFileError(f"control-plane key file {path}: cannot read it ({type(e).__name__})") from None
    digits = text.removesuffix("\n")
    if len(digits) != _HEX_DIGITS or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise KeyFileError(f"control-plane key file {path}: not a key: expected {_HEX_DIGITS} hex digits and a "
                           "newline (`tiertp keys` writes one)")
    return ControlKey(bytes.fromhex(digits))


def require_key_file(path: Path | None, who: str) -> ControlKey:
    """The key in `path`, which a command must be given; KeyFileError naming
    the option when it is missing. `who`: whom the key admits."""
    if path is None:
        raise KeyFileError(f"--key-file is required: {who} (`tiertp keys FILE` makes one; the gateway and its "
                           "agents are given the same file)")
    return load_key_file(path)
