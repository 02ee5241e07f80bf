"""Files a user names (rules, keys, tokens, users, review settings): regular files of bounded size, read once.

A FIFO opened for reading waits for a writer, forever; a device or /proc file can be endless. Each is opened
without blocking and checked on the open descriptor (no window between the check and the read).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_CONFIG_BYTES = 4 << 20  # a rules file is a few KB; 4 MiB leaves room and still bounds a hostile one
MAX_KEY_BYTES = 64 << 10

KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class ConfigFileError(OSError):
    """A named file is not a regular file or is too big; `strerror` says which, in words."""


def read_config_bytes(path: str | os.PathLike, max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; ConfigFileError otherwise (OSError when it cannot be opened)."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in KINDS if test(mode)), "not a regular file")
            raise ConfigFileError(errno.EINVAL, f"{kind}, not a regular file", str(path))
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ConfigFileError(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
    return b"".join(chunks)


def read_config_text(path: str | os.PathLike, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """`read_config_bytes` as UTF-8 text (UnicodeDecodeError, a ValueError, when it is not)."""
    return read_config_bytes(path, max_bytes).decode("utf-8")
