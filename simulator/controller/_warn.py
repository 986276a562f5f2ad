"""Where the controller's warnings point: the user's line, whichever path led to them."""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_THREADS = (os.path.dirname(concurrent.futures.__file__) + os.sep, threading.__file__)
"""Where a background thread's stack begins: a warning given there has no user's line."""


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning given by the caller of this function name the
    first frame outside the controller package: the user's ``save()``, ``restore()``,
    ``step()`` or ``close()`` line, however many of the controller's own frames lie between
    (a count fixed at each call site is right for one path only). On the controller's own
    background thread (an asynchronous save's write), whose stack begins in the thread
    machinery, and where no frame lies outside the package (an atexit hook), the outermost
    frame of the controller's instead."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    if frame is None or frame.f_code.co_filename.startswith(_THREADS):
        return level - 1
    return level
