"""What our package changes in Beam's execution: two memory fixes and one wait, nothing that changes an output.

All run when ``dp_partition_beam.transforms.core`` is first imported, which is before any of our DoFns runs
in a process: :func:`release_output_buffers` and :func:`shorten_state_sampling` in the launching process of
the in-memory DirectRunner and in every SDK worker that unpickles one of our DoFns (multi_processing, Flink,
Spark, Dataflow); :func:`chunk_runner_input` where Beam's FnApiRunner runs (the DirectRunner's launching
process). Each checks that Beam's code has the shape it was written for and otherwise leaves Beam as it is.
"""

from __future__ import annotations

import inspect

__all__ = ["release_output_buffers", "chunk_runner_input", "shorten_state_sampling", "SAMPLING_PERIOD_MS"]


def _replace(owner, name: str, marker: str, fits, make) -> bool:
    """Put ``make(beams)`` in place of Beam's ``owner.name`` (``beams``) if ``fits(beams)``; marked with
    ``marker``, so that a second call is a no-op, and with Beam's own as ``_replaced`` (for the tests).
    Returns whether ours is in place: False, and Beam left as it is, if the class or attribute is missing
    or ``fits`` says it is not the code ours was written for."""
    beams = getattr(owner, name, None) if owner is not None else None
    if getattr(beams, marker, False):
        return True
    if beams is None or not fits(beams):
        return False
    ours = make(beams)
    setattr(ours, marker, True)
    ours._replaced = beams
    ours.__doc__ = beams.__doc__
    setattr(owner, name, ours)
    return True


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

    def make(finish):
        def finish_and_release(self):
            finish(self)  # closes the stream: its bytes go to the runner
            self.output_stream = None  # and its buffer is freed with it

        return finish_and_release

    return _replace(op, "finish", "_releases_output_stream", lambda _: hasattr(op, "set_output_stream"), make)


#: the body of ``BundleManager._send_input_to_worker`` that :func:`chunk_runner_input` replaces (Beam 2.51-2.77)
_SEND_INPUT_LINES = ("for byte_stream in (byte_streams or []):", "data_out.write(byte_stream)", "data_out.close()")


def chunk_runner_input() -> bool:
    """Make Beam's FnApiRunner send a bundle's input to its worker in ~10 MB chunks instead of one block.

    ``BundleManager._send_input_to_worker`` writes every buffer of a stage's input into one output stream and
    flushes it once at the end, so the whole input exists at once as that stream's buffer (grown by
    doubling), as the bytes copied out of it, and as the data message holding them. DPNE on all of MSNBC
    (``--selection single``, in-memory runner) held 268 MB in one such buffer at its peak. After this the
    stream is flushed at element boundaries whenever it holds more than Beam's flush threshold (10 MB), as
    the SDK harness does with its outputs: the worker receives the same elements in the same order, in
    several data messages. DPNE on MSNBC: peak RSS 1.16 -> 0.76-0.78 GB (docs/columnar.md, "Memory: Beam's
    output buffers").

    Process-wide; idempotent. Returns whether the change is in place: False, and Beam left as it is, if
    this Beam's method is not the one it was written for (its source must hold the lines it replaces).
    """
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    def fits(send):
        try:
            source = inspect.getsource(send)
        except (OSError, TypeError):
            return False
        return all(line in source for line in _SEND_INPUT_LINES)

    def make(send):
        def send_in_chunks(self, process_bundle_id, read_transform_id, byte_streams):
            assert self._worker_handler is not None
            data_out = self._worker_handler.data_conn.output_stream(process_bundle_id, read_transform_id)
            for byte_stream in byte_streams or []:  # each a whole number of encoded elements
                data_out.write(byte_stream)
                data_out.maybe_flush()  # flushes past the threshold, between elements
            data_out.close()

        return send_in_chunks

    manager = getattr(fn_runner, "BundleManager", None)
    return _replace(manager, "_send_input_to_worker", "_sends_in_chunks", fits, make)


#: the longest sleep of Beam's state sampler once :func:`shorten_state_sampling` is in place (Beam's: 200 ms)
SAMPLING_PERIOD_MS = 5


def shorten_state_sampling() -> bool:
    """Make the state samplers that Beam's SDK harness creates sleep at most 5 ms between samples, not 200 ms.

    Each bundle processor has a state sampler: a thread that samples which step the bundle is in, sleeping
    1-2 ms at first and 1.2 times longer after each sample, up to the sampler's period (Beam's default
    200 ms). When the bundle ends, ``stop`` waits for that thread to wake up and exit: up to a whole period,
    with the bundle's thread idle. MAD-SIPS on the 4M-pair Zipf TSV (in-memory DirectRunner) ends ~110
    samplers this way and waited 0.9 s in ``Thread.join``; with 5 ms the CLI's run took ~0.6 s (~5%) less,
    basic's ~0.3 s (docs/columnar.md, "Runner overhead: the state sampler's wait"). The sampler thread holds no GIL
    while it sleeps or samples, and its samples (Beam's ``ptransform_execution_time`` counters, which
    ``--profile`` reports) get finer; nothing a step emits changes.

    Only the default changes: a caller that passes ``sampling_period_ms`` keeps its value. Process-wide;
    idempotent. Returns whether the change is in place: False, and Beam left as it is, if this Beam's
    ``StateSampler.__init__`` does not take ``(prefix, counter_factory, sampling_period_ms=...)`` (Beam
    2.51-2.77 do).
    """
    from apache_beam.runners.worker import statesampler

    def fits(init):
        try:
            names = list(inspect.signature(init).parameters)
        except (TypeError, ValueError):
            return False
        return names[:4] == ["self", "prefix", "counter_factory", "sampling_period_ms"]

    def make(init):
        def init_sampling_often(self, prefix, counter_factory, sampling_period_ms=SAMPLING_PERIOD_MS, *args, **kw):
            init(self, prefix, counter_factory, sampling_period_ms, *args, **kw)

        return init_sampling_often

    return _replace(getattr(statesampler, "StateSampler", None), "__init__", "_samples_often", fits, make)
