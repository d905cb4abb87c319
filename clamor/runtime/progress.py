"""Progress bars for long stages (tqdm), only where someone can see them."""
import sys
import time

SHOW_AFTER_S = 2.0


class StageProgress:
    """A bar that appears once a stage has run for two seconds, if stderr is
    a terminal (or ``enabled`` is True), and never if ``enabled`` is False."""

    def __init__(self, total, desc, enabled=None):
        self.total, self.desc = total, desc
        self.enabled = enabled if enabled is not None else sys.stderr.isatty()
        self.done = 0
        self.t0 = time.monotonic()
        self.bar = None

    def update(self, n=1):
        self.done += n
        if self.bar is None and self.enabled and time.monotonic() - self.t0 >= SHOW_AFTER_S:
            from tqdm import tqdm    # (imported once a bar shows: 60 ms every process would pay)
            self.bar = tqdm(total=self.total, desc=self.desc, initial=self.done, leave=False,
                            file=sys.stderr, dynamic_ncols=True)
        elif self.bar is not None and n:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
