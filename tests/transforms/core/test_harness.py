"""Our steps free their output buffers when their bundles end (transforms/core/harness.py).

Beam's SDK harness encodes a step's output into a stream that keeps its buffer after the bundle, and caches
the finished bundle processor with it: every stage that ran kept up to ~20 MB per output until the process's
bundle processors were shut down (MAD-SIPS on a 4M-pair TSV, in-memory runner: ~330 MB, 40% of its peak;
docs/columnar.md, "Memory: Beam's output buffers"). The change is process-wide, so each case runs in fresh
interpreters (tests/support/output_buffers_probe.py). And the FnApiRunner sends a bundle's input to its
worker in ~10 MB chunks instead of one block (harness.chunk_runner_input; DPNE on MSNBC 1.16 -> 0.76-0.78 GB).
"""

import os
import subprocess
import sys

import pytest

from dp_partition_beam.transforms.core import harness

from tests.support.output_buffers_probe import CHUNKS, MB

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def retained(ours: bool, mode: str, tmp_path) -> int:
    """Bytes that output streams still hold in the process that ran the probe's stages."""
    out = tmp_path / f"retained-{ours}-{mode}"
    env = {**os.environ, "PROBE_OURS": "1" if ours else "0", "PROBE_OUT": str(out)}
    code = f"from tests.support.output_buffers_probe import main; main({mode!r})"  # steps pickled by module name
    cmd = [sys.executable, "-c", code]
    subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return int(out.read_text())


def test_beam_alone_keeps_a_finished_steps_buffer(tmp_path):
    """The probe sees the emitting stage's closed stream still alive (if a Beam release frees it itself, this
    fails and harness.release_output_buffers can go)."""
    assert retained(False, "in_memory", tmp_path) >= CHUNKS * MB


def test_with_our_package_loaded_the_buffers_are_freed(tmp_path):
    assert retained(True, "in_memory", tmp_path) < MB


def test_multi_processing_workers_free_them_too(tmp_path):
    """A worker imports our package when it unpickles a step of ours; the probe's steps do the same import."""
    assert retained(False, "multi_processing", tmp_path) >= CHUNKS * MB
    assert retained(True, "multi_processing", tmp_path) < MB


@pytest.fixture(scope="module")
def fresh_import():
    """What importing one of our transforms changes in a fresh interpreter (Beam imported first): the output
    stream's release on finish, then the state sampler's periods (Beam's default, ours, a caller's), each
    before and after the import. One interpreter for both patches (each costs ~2 CPU-s of imports): both
    are installed by the same import of transforms.core, and each is read before and after it."""
    code = (
        "from apache_beam.runners.worker import bundle_processor as b\n"
        "from apache_beam.runners.worker.statesampler import StateSampler\n"
        "from apache_beam.utils.counters import CounterFactory\n"
        "before = getattr(b.DataOutputOperation.finish, '_releases_output_stream', False)\n"
        "period = StateSampler('s', CounterFactory()).sampling_period_ms\n"
        "import dp_partition_beam.transforms.selection.mad\n"
        "print(before, b.DataOutputOperation.finish._releases_output_stream)\n"
        "after = StateSampler('s', CounterFactory())\n"
        "given = StateSampler('s', CounterFactory(), 50)\n"
        "print(period, after.sampling_period_ms, given.sampling_period_ms)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_importing_our_transforms_installs_it_once(fresh_import):
    assert fresh_import[0].split() == ["False", "True"]
    from apache_beam.runners.worker import bundle_processor

    finish = bundle_processor.DataOutputOperation.finish
    assert harness.release_output_buffers() is True
    assert bundle_processor.DataOutputOperation.finish is finish  # not wrapped twice


# --- the runner's side: a bundle's input goes to the worker in chunks (harness.chunk_runner_input) ---------


class _Handler:
    def __init__(self):
        from apache_beam.runners.worker import data_plane

        self.data_conn = data_plane.InMemoryDataChannel()


class _Manager:
    def __init__(self):
        self._worker_handler = _Handler()


def _sent(send, byte_streams):
    """The data messages ``send`` gives the worker for one bundle's input."""
    manager = _Manager()
    send(manager, "bundle", "read", byte_streams)
    return [m.data for m in manager._worker_handler.data_conn.inverse()._inputs if m.data]


def test_the_runner_sends_a_bundles_input_in_chunks():
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.worker import data_plane

    assert harness.chunk_runner_input() is True  # in place since transforms.core was imported
    ours = fn_runner.BundleManager._send_input_to_worker
    assert ours._sends_in_chunks and harness.chunk_runner_input() is True
    assert fn_runner.BundleManager._send_input_to_worker is ours  # not wrapped twice
    streams = [bytes([i]) * (3 * MB) for i in range(12)]  # 36 MB of input in 3 MB buffers
    beams = _sent(ours._replaced, streams)
    assert beams == [b"".join(streams)]  # Beam's: the whole input in one block (what the change is for)
    chunks = _sent(ours, streams)
    assert b"".join(chunks) == b"".join(streams)  # the same bytes in the same order
    assert len(chunks) > 1
    assert max(map(len, chunks)) <= data_plane._DEFAULT_SIZE_FLUSH_THRESHOLD + 3 * MB
    assert all(len(c) % (3 * MB) == 0 for c in chunks)  # cut only between the buffers given


# --- the state sampler's wait at the end of every bundle (harness.shorten_state_sampling) -------------------


def test_importing_our_transforms_shortens_the_samplers_period_only_by_default(fresh_import):
    # Beam's default, ours, a caller's
    assert fresh_import[1].split() == ["200", str(harness.SAMPLING_PERIOD_MS), "50"]


def test_the_shortened_sampler_still_samples_and_is_installed_once():
    import time

    from apache_beam.runners.worker import statesampler
    from apache_beam.utils.counters import CounterFactory

    init = statesampler.StateSampler.__init__
    assert init._samples_often and harness.shorten_state_sampling() is True
    assert statesampler.StateSampler.__init__ is init  # not wrapped twice
    factory = CounterFactory()
    sampler = statesampler.StateSampler("stage", factory)
    sampler.start()
    with sampler.scoped_state("step", "process"):
        time.sleep(0.1)
    sampler.stop()
    sampler.commit_counters()
    msecs = [c.value() for c in factory.get_counters() if "step" in str(c.name)]
    assert msecs and sum(msecs) > 0  # the step's time was sampled (Beam's execution-time counter)


def test_a_replacement_goes_in_only_where_beams_code_fits_and_only_once():
    class Beams:
        def step(self):
            """Beam's."""
            return "beam"

    def make(beams):
        def ours(self):
            return "ours:" + beams(self)

        return ours

    assert harness._replace(None, "step", "_mark", lambda _: True, make) is False  # no such class
    assert harness._replace(Beams, "absent", "_mark", lambda _: True, make) is False  # no such attribute
    assert harness._replace(Beams, "step", "_mark", lambda _: False, make) is False  # not the code it was written for
    assert Beams().step() == "beam" and not hasattr(Beams, "absent")  # left as it was
    assert harness._replace(Beams, "step", "_mark", lambda _: True, make) is True
    replaced = Beams.step
    assert Beams().step() == "ours:beam" and replaced.__doc__ == "Beam's." and replaced._replaced(Beams()) == "beam"
    assert harness._replace(Beams, "step", "_mark", lambda _: True, make) is True  # a second call: no-op
    assert Beams.step is replaced and Beams().step() == "ours:beam"
