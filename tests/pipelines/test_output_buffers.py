"""In-process runs free each step's output buffer when its bundle ends (pipelines/runner.release_output_buffers).

Beam's SDK harness encodes a step's output into a stream that keeps its buffer after the bundle, and caches
the finished bundle processor with it: on the in-memory DirectRunner every stage that ran kept up to ~20 MB
per output until the run ended (MAD-SIPS on a 4M-pair TSV: ~330 MB, 40% of its peak; docs/columnar.md,
"Memory"). The change is process-global, so each case runs its pipeline in a fresh interpreter.
"""

import gc
import os
import subprocess
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import bundle_processor, data_plane

from dp_partition_beam.pipelines import runner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MB = 1 << 20
CHUNKS = 8  # one step emits 8 MB: under the harness's 10 MB flush threshold, so its stream holds all of it


class EmitChunks(beam.DoFn):
    def process(self, _):
        for i in range(CHUNKS):
            yield i % 2, bytes(MB)


def retained_stream_bytes(_):
    """Bytes in output streams still alive (this runs in a stage after every stage that emitted the chunks)."""
    gc.collect()
    return sum(s.size() for s in gc.get_objects() if isinstance(s, data_plane.ClosableOutputStream))


def probe(through_cli_runner: bool) -> None:
    """Run a pipeline whose first stage emits 8 MB, then print the bytes that output streams still hold."""
    options = PipelineOptions(["--direct_running_mode", "in_memory", "--no_pipeline_type_check"])
    pipeline = runner.make_pipeline(options)
    _ = (
        pipeline
        | beam.Create([None])
        | "Emit" >> beam.ParDo(EmitChunks())  # (0|1, 1 MB of bytes): 8 MB out of one stage
        | beam.GroupByKey()
        | beam.MapTuple(lambda k, chunks: sum(map(len, chunks)))
        | beam.CombineGlobally(sum)  # every earlier stage has finished
        | beam.Map(retained_stream_bytes)
        | beam.Map(lambda n: print(f"retained {n}", flush=True))
    )
    result = runner.run(pipeline) if through_cli_runner else pipeline.run()
    result.wait_until_finish()


def retained(through_cli_runner: bool) -> int:
    code = f"from tests.pipelines.test_output_buffers import probe; probe({through_cli_runner})"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("retained ")]
    assert len(lines) == 1, out.stdout + out.stderr
    return int(lines[0].split()[1])


def test_the_clis_runs_free_each_steps_output_buffer():
    assert retained(through_cli_runner=True) < MB


def test_beam_alone_keeps_them_which_is_what_the_change_is_for():
    """Without the change the emitting stage's closed stream is still alive: the probe can see a retained buffer
    (if a Beam release frees it itself, this fails and release_output_buffers can go)."""
    assert retained(through_cli_runner=False) >= CHUNKS * MB


def test_the_change_is_installed_once():
    assert runner.release_output_buffers() is True
    finish = bundle_processor.DataOutputOperation.finish
    assert runner.release_output_buffers() is True
    assert bundle_processor.DataOutputOperation.finish is finish  # not wrapped twice
    assert finish._releases_output_stream
