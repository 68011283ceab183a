"""What our package changes in the Beam SDK harness that runs its steps: one memory fix, nothing else.

:func:`release_output_buffers` runs when ``dp_partition_beam.transforms.core`` is first imported, which is
before any of our DoFns runs in a process: in the launching process of the in-memory DirectRunner and in
every SDK worker that unpickles one of our DoFns (multi_processing, Flink, Spark, Dataflow).
"""

from __future__ import annotations

__all__ = ["release_output_buffers"]


def release_output_buffers() -> bool:
    """Make the Beam SDK harness of this process free a step's output buffer when the step's bundle ends.

    Each output of a fused stage is encoded into an output stream (``DataOutputOperation.output_stream``)
    that flushes every ~10 MB but keeps its buffer's capacity (up to ~2x that). The operation keeps its
    last stream after ``finish`` and Beam caches the finished bundle processor for reuse, so every stage
    that ran kept up to ~20 MB per output until the process's bundle processors were shut down. MAD-SIPS
    on the 4M-pair Zipf TSV (~50 stages, in-memory DirectRunner) held ~330 MB this way, 40% of its peak
    resident memory; each multi_processing worker ~190 MB (docs/columnar.md, "Memory: Beam's output
    buffers"). After this, ``finish`` drops the closed stream; the next bundle sets a new one before it
    emits anything, so what is emitted, and when, is unchanged.

    Process-wide (every pipeline this process runs); idempotent. Returns whether the change is in place:
    False, and Beam left as it is, if this Beam's ``DataOutputOperation`` has not the shape it was written
    for (Beam 2.51-2.77 have it).
    """
    from apache_beam.runners.worker import bundle_processor

    op = getattr(bundle_processor, "DataOutputOperation", None)
    finish = getattr(op, "finish", None)
    if finish is None or not hasattr(op, "set_output_stream"):
        return False
    if getattr(finish, "_releases_output_stream", False):
        return True

    def finish_and_release(self):
        finish(self)  # closes the stream: its bytes go to the runner
        self.output_stream = None  # and its buffer is freed with it

    finish_and_release._releases_output_stream = True
    finish_and_release.__doc__ = finish.__doc__
    op.finish = finish_and_release
    return True
