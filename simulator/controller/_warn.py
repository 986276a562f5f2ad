"""Where the controller's warnings point: the user's line, whichever path led to them."""

from __future__ import annotations

import os
import sys

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning given by the caller of this function name the
    first frame outside the controller package: the user's ``save()``, ``restore()``,
    ``step()`` or ``close()`` line, however many of the controller's own frames lie between
    (a count fixed at each call site is right for one path only)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level
