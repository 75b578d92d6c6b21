"""Text from files shown to a person (terminal, HTML report): control and bidi characters made visible.

Claim names, table cells and spec values come from files that may not be the reader's. Written raw, a
BEL rings, an ESC sequence moves the cursor or retitles the terminal, and U+202E (right-to-left
override) makes a line read differently from its bytes ("Trojan Source"). Each such character is shown
as its escape (``\\x07``, ``\\u202e``) instead, so the reader sees that it was there and what it was.
"""

from __future__ import annotations

import re

__all__ = ["visible"]

# C0 controls but tab and newline, DEL, C1 controls, and the bidi embedding, override, isolate and mark characters.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object) -> str:
    """Return ``text`` as a string with every control and bidi character replaced by its visible escape."""
    return _HIDDEN.sub(_escape, str(text))
