"""Reading the text files a user hands grpokit (data, recipe, checkpoint state, metrics) as UTF-8.

Every user file is read through :func:`read_utf8` (whole file) or :func:`iter_utf8_lines` (a stream
of lines, for files read only up to a row limit). Both decode strictly, whatever the locale, and a
byte sequence that is not UTF-8 raises :class:`NotUtf8Error`, a ``ValueError`` whose one-line
message names the file, the line and the byte offset::

    data.jsonl: line 3: not valid UTF-8 (byte 0xe9 at offset 57 of the file)

A leading UTF-8 byte-order mark (``EF BB BF``, what Excel and many Windows tools write) is dropped,
as ``encoding="utf-8-sig"`` drops it, so a file reads the same rows with or without one; byte
offsets in messages still count it (they are offsets in the file).

Lines are split as ``open(..., newline="")`` splits them (``\\n``, ``\\r\\n`` or a lone ``\\r``;
the line ending is kept), so line numbers agree with an editor's and with ``csv``.
Imports the standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

__all__ = ["NotUtf8Error", "read_utf8", "iter_utf8_lines"]

_LONE_CR = re.compile(r"(?<=\r)(?!\n)")  # the place after a "\r" that does not start "\r\n"
_LONE_CR_BYTES = re.compile(rb"\r(?!\n)")
BOM = "\ufeff"  # U+FEFF decoded; b"\xef\xbb\xbf" in the file


class NotUtf8Error(ValueError):
    """A file holds bytes that are not UTF-8. One-argument constructor, like any ``ValueError``.

    Attributes: ``path`` (as given), ``line`` (1-based), ``offset`` (0-based byte offset in the
    file), ``byte`` (the first byte that does not decode).
    """

    def __init__(self, message: str, *, path: str = "", line: int = 0, offset: int = 0, byte: int = 0):
        super().__init__(message)
        self.path, self.line, self.offset, self.byte = path, line, offset, byte

    @classmethod
    def at(cls, path: str | Path, line: int, offset: int, byte: int) -> NotUtf8Error:
        return cls(
            f"{path}: line {line}: not valid UTF-8 (byte 0x{byte:02x} at offset {offset} of the file)",
            path=str(path),
            line=line,
            offset=offset,
            byte=byte,
        )


def _line_breaks(prefix: bytes) -> int:
    """Number of line ends (``\\n``, ``\\r\\n``, lone ``\\r``) in ``prefix``."""
    return prefix.count(b"\n") + len(_LONE_CR_BYTES.findall(prefix))


def read_utf8(path: str | Path) -> str:
    """The whole file decoded as UTF-8, without a leading byte-order mark (as ``encoding="utf-8-sig"``).

    Raises:
        NotUtf8Error: a byte sequence that is not UTF-8 (message: file, line, byte offset).
        OSError: the file cannot be opened (``FileNotFoundError`` among them).
    """
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        # a "\r" just before the bad byte is a line end only if the bad byte is not "\n": it never is
        raise NotUtf8Error.at(path, 1 + _line_breaks(data[: e.start]), e.start, data[e.start]) from None
    return text[1:] if text.startswith(BOM) else text


def iter_utf8_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line_number, line)`` for each line of the file, decoded as UTF-8, read lazily.

    Lines keep their ending (``\\n``, ``\\r\\n`` or ``\\r``), as with ``open(path, newline="")``,
    so the lines can be handed to ``csv.reader``. Line numbers start at 1. A leading byte-order
    mark is not part of line 1.

    Raises:
        NotUtf8Error: when the reading reaches a byte sequence that is not UTF-8.
        OSError: the file cannot be opened.
    """
    offset, lineno = 0, 0
    with open(path, "rb") as f:
        for raw in f:  # split at b"\n", which never occurs inside a multi-byte UTF-8 character
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                line = lineno + 1 + _line_breaks(raw[: e.start])
                raise NotUtf8Error.at(path, line, offset + e.start, raw[e.start]) from None
            if offset == 0 and text.startswith(BOM):
                text = text[1:]
            offset += len(raw)
            for piece in _LONE_CR.split(text) if "\r" in text else (text,):
                if piece:
                    lineno += 1
                    yield lineno, piece
