"""Bounded reading of the text files the commands take (`mtserve shortlist`'s corpora, `mtserve
import --sentences`): UTF-8 lines, gzip when the name ends in .gz, no line longer than
`max_line_chars`, no more than `max_bytes` of text read. Anything else is a ValueError naming the
file and the line, never a file read whole into memory (a 5 MB line, /dev/zero)."""

from __future__ import annotations

import gzip
import io
import zlib
from typing import IO

MAX_LINE_CHARS = 1000  # a line of a corpus: Multi30k's longest is under 400, a news sentence a few hundred
MAX_BYTES = 256 << 20  # of text read from one file


def _open(path: str) -> IO[str]:
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_lines(
    path: str,
    limit: int | None = None,
    max_line_chars: int = MAX_LINE_CHARS,
    max_bytes: int = MAX_BYTES,
) -> list[str]:
    """The first `limit` lines of `path` (all: None), without their line ends."""
    lines: list[str] = []
    read = 0
    try:
        with _open(path) as f:
            while limit is None or len(lines) < limit:
                line = f.readline(max_line_chars + 2)  # the text, its "\n" and one more to see it is longer
                if not line:
                    break
                text = line.rstrip("\r\n")
                if len(text) > max_line_chars:
                    raise ValueError(f"{path}: line {len(lines) + 1} is longer than {max_line_chars} characters")
                read += len(line)
                if read > max_bytes:
                    raise ValueError(f"{path}: more than {max_bytes} characters of text; give --limit")
                lines.append(text)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: line {len(lines) + 1} is not UTF-8 text ({e.reason})") from None
    except (gzip.BadGzipFile, zlib.error, EOFError, OSError) as e:
        if isinstance(e, (FileNotFoundError, IsADirectoryError, PermissionError)):
            raise ValueError(f"{path}: cannot be read ({e.strerror})") from None
        raise ValueError(f"{path}: not a gzip file ({e})" if path.endswith(".gz") else f"{path}: {e}") from None
    return lines
