"""A pipeline whose first stage emits 8 MB; a later stage writes how many bytes output streams still hold.

    PROBE_OURS=1|0 PROBE_OUT=file python -c "from tests.support.output_buffers_probe import main; main(MODE)"

(MODE in_memory or multi_processing; imported, not run as __main__, so workers unpickle the steps by module
name, as they do ours.)

Beam only, unless ``PROBE_OURS=1``: then every process that runs the probe's steps (the launcher, and each
multi_processing worker when it unpickles them) imports ``dp_partition_beam.transforms.core`` first, as it
does when it unpickles one of our DoFns. Used by tests/transforms/core/test_harness.py.
"""

import gc
import os

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.worker import data_plane

if os.environ.get("PROBE_OURS") == "1":
    import dp_partition_beam.transforms.core  # noqa: F401  (what unpickling any of our DoFns does first)

MB = 1 << 20
CHUNKS = 8  # 8 MB from one step: under the harness's 10 MB flush threshold, so its stream holds all of it


class EmitChunks(beam.DoFn):
    def process(self, _):
        for i in range(CHUNKS):
            yield i % 2, bytes(MB)


class WriteRetained(beam.DoFn):
    """Runs in a stage after every stage that emitted the chunks, in the process that ran them."""

    def process(self, _):
        gc.collect()
        held = sum(s.size() for s in gc.get_objects() if isinstance(s, data_plane.ClosableOutputStream))
        with open(os.environ["PROBE_OUT"], "w") as f:
            f.write(str(held))


def main(mode: str) -> None:
    flags = ["--direct_running_mode", mode, "--direct_num_workers", "1", "--no_pipeline_type_check"]
    runner = FnApiRunner() if mode == "in_memory" else "DirectRunner"  # in_memory: never Beam's Prism detour
    with beam.Pipeline(runner=runner, options=PipelineOptions(flags)) as pipeline:
        _ = (
            pipeline
            | beam.Create([None])
            | "Emit" >> beam.ParDo(EmitChunks())  # (0|1, 1 MB of bytes): 8 MB out of one stage
            | beam.GroupByKey()
            | beam.MapTuple(lambda k, chunks: sum(map(len, chunks)))
            | beam.CombineGlobally(sum)  # every earlier stage has finished
            | beam.ParDo(WriteRetained())
        )
