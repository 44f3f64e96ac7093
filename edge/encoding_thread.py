"""A camera's stream encoder on a thread of its own.

x264 releases the GIL while it encodes, so a camera's matched frames are encoded on another core while its next
frames go through the base DNN. On the camera's thread, a 1080p frame at x264 `medium` (about 110 ms on the
development machine) alone took more than the 80 ms a frame has at 12.5 fps. Jobs run in the order they were
submitted; a bounded queue makes the camera wait (and its source drop frames) rather than buffer without end
when the encoder cannot keep up. A stream event's end message is a job too (CameraPipeline), so it goes after the
event's fragments without the camera waiting for them. An error is raised on the camera's thread at its next call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from common.fragment import Fragment
from edge.stream_encoder import StreamEncoder

# Frames (and other jobs) waiting for the encoder: about a second at 12.5 fps (a 1080p frame holds 6 MB). Half
# that dropped 1-13 frames in 20 s of a 1080p camera whose filters matched 62% of its frames: x264 falls behind
# while the base DNN has the cores, and catches up between frames (bench/cameras.py, README).
QUEUE_DEPTH = 12

Job = Callable[[StreamEncoder], list[Fragment] | None]


class EncodingThread:
    """Runs jobs on `encoder` in order on its own thread; the fragments they close go to `emit` there."""

    def __init__(self, camera: str, encoder: StreamEncoder, emit: Callable[[list[Fragment]], None]) -> None:
        self._encoder, self._emit = encoder, emit
        self._jobs: queue.Queue[Job] = queue.Queue(QUEUE_DEPTH)
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name=f"encode-{camera}", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job` (waits while the queue is full); raises the error of an earlier job, if any."""
        self._raise()
        self._jobs.put(job)

    def wait(self) -> None:
        """Return once every job submitted so far has run and its fragments have been emitted."""
        self._jobs.join()
        self._raise()

    def _raise(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                fragments = job(self._encoder)
                if fragments:
                    self._emit(fragments)
            except Exception as error:
                self._error = error
            finally:
                self._jobs.task_done()
