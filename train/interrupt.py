"""Ctrl-C for the command lines (``python -m train``, ``python -m train.evaluate``).

Light on purpose: a command installs :data:`INTERRUPT` before its slow imports.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import NoReturn

INTERRUPT_GRACE = 15.0   # seconds the clean-up after a Ctrl-C may take before the run exits anyway


class Interrupt:
    """Ctrl-C for the command line: one line, exit code 130, no traceback, no sandbox left.

    The first SIGINT unwinds the main thread, so ``finally`` blocks and the trainer's ``close``
    run: in a running event loop it cancels the loop's tasks (as ``asyncio.run`` does; a
    KeyboardInterrupt there resurfaces from every task awaiting the one it hit), elsewhere it
    raises KeyboardInterrupt, but never inside a ``__del__``, where Python would print it and
    carry on (it comes a moment later instead). Logging below CRITICAL stops: what threads
    racing the shut-down report is noise by then. If the process still runs
    ``INTERRUPT_GRACE`` seconds later, or at a second SIGINT, the live pools' sandboxes are
    reaped and it exits at once.
    """

    def __init__(self) -> None:
        self.raised = False
        self.catching = False   # main() is ready to catch it; before, there is nothing to clean up
        self._said = threading.Lock()

    def install(self) -> None:
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:   # `nohup`, `&`: stays ignored
            signal.signal(signal.SIGINT, self.handler)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if not self.catching:   # still importing
            self.exit_now()
        if self.raised:
            threading.Thread(target=self.exit_now, daemon=True).start()
            return
        asyncio = sys.modules.get("asyncio")   # no import here: the main thread may be importing it
        try:
            loop = asyncio.get_running_loop() if asyncio is not None else None
        except (RuntimeError, AttributeError):
            loop = None
        f = frame
        while loop is None and f is not None:
            if f.f_code.co_name == "__del__":
                threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
                return
            f = f.f_back
        self.raised = True
        logging = sys.modules.get("logging")
        if hasattr(logging, "disable"):
            logging.disable(logging.ERROR)
        threading.Thread(target=self.exit_now, args=(INTERRUPT_GRACE,), daemon=True).start()
        if loop is None:
            raise KeyboardInterrupt
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.call_soon_threadsafe(lambda: None)   # wake the loop up

    def report(self) -> None:
        """Say it once, whoever gets here first."""
        if self._said.acquire(blocking=False):
            print("interrupted", file=sys.stderr, flush=True)

    def exit(self, code: int) -> NoReturn:
        """End the command with ``code``: ``sys.exit`` normally; after an interrupt (130), with
        SIGINT ignored from here on, the atexit hooks run, then ``os._exit(130)``, never Python's
        finalization: it restores SIGINT's default action, so a late SIGINT (one deferred out of a
        ``__del__``) would end the process with status -2 after it said "interrupted"."""
        if code != 130:
            sys.exit(code)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)

    def exit_now(self, after: float = 0.0) -> None:
        time.sleep(after)
        pool = sys.modules.get("nextstate.containers.pool")
        if pool is not None:
            pool.reap_live_pools()
        self.report()
        os._exit(130)


INTERRUPT = Interrupt()
