"""The tags a page's tests inject faults at, and the page without them.

A test replaces a page statement that ends with ``# fault-point: NAME`` (``tests/faults.py``) to
prove that the page's check for that mistake fails. The tag is for the tests: the code a reader
sees (the rendered page, a script shown side by side) is the page without it. One pattern for
both, so a tag the tests find is always one the reader does not see.
"""

from __future__ import annotations

import re

__all__ = ["TAG", "without_tags"]

#: ``  # fault-point: NAME`` at the end of a line (the spaces before it included); group 1: NAME.
TAG = re.compile(r"[ \t]*#[ \t]*fault-point:[ \t]*(\S+)[ \t]*$", re.M)


def without_tags(text: str) -> str:
    """``text`` with every fault-point tag removed, the statements it ended kept."""
    return TAG.sub("", text)
