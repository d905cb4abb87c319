"""Ctrl-C taken between messages, never inside one.

A driver loop reads multipart messages frame by frame.  Were a
KeyboardInterrupt raised between two frames, the message would be torn: its
head lost and its tail read later as a message of its own, and the report it
carried (a task done, a slot free) lost for good.  Within ``Deferred``, a
SIGINT is noted instead, and ``check()`` raises it where the loop is between
messages.  A SIGINT that comes more than ``ESCAPE_S`` seconds after one still
waiting raises at once, so a stuck loop can still be left (signals in quick
succession, a held key or a process group signalled twice, wait for the
next check like the first).

Only the main thread receives signals, and only Python's own handler is
replaced: in another thread, or where the program installed its own handler,
``Deferred`` changes nothing and ``check()`` never raises.
"""
import signal
import threading
import time

__all__ = ["Deferred"]

ESCAPE_S = 2.0


class Deferred:
    def __init__(self):
        self.pending = False
        self._since = 0.0
        self._installed = False

    def __enter__(self):
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            signal.signal(signal.SIGINT, self._note)
            self._installed = True
        return self

    def _note(self, signum, frame):
        now = time.monotonic()
        if self.pending and now - self._since > ESCAPE_S:
            raise KeyboardInterrupt
        if not self.pending:
            self.pending, self._since = True, now

    def check(self):
        """Raise the KeyboardInterrupt noted since the last call, if any."""
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def __exit__(self, kind, value, tb):
        if self._installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._installed = False
        if kind is None:
            self.check()     # noted after the last check: not lost
        return False
