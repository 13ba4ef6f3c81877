"""What a binary input (a capture, an HloProto) looks like when it was damaged on its way here, in words."""

from __future__ import annotations

# A binary file copied as text (a web page's raw view, a text editor, a text API) has every byte that is not UTF-8
# replaced by U+FFFD; a real capture or HloProto may hold the sequence by chance, not this often.
_REPLACEMENT = b"\xef\xbf\xbd"
_COPIED_AS_TEXT_AT_LEAST = 64


def copied_as_text(data: bytes) -> str | None:
    """Why a binary file (a capture, an HloProto) cannot be read when it was copied as text, in words; None when it
    does not look so."""
    replaced = data.count(_REPLACEMENT)
    if replaced < _COPIED_AS_TEXT_AT_LEAST:
        return None
    return (f"it holds {replaced:,} UTF-8 replacement characters (EF BF BD), as a binary file does after it was "
            "copied as text; copy it again as bytes (gsutil cp, scp, a raw download).")
