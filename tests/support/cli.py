"""The CLIs for tests: argument lists, in-process runs that must fail, and the reader a CLI builds.

``select_argv`` / ``ngrams_argv`` / ``bayes_argv``: the argv of one in-memory run writing under ``out_dir``
(``--algorithm basic`` by default: the selection is not what these runs test). ``run_fails``: a run that
must stop on its input (exit 3, one ``error:`` line, no file written or changed). ``CliReader``: the
``ReadRecordBatches`` a CLI builds for an argv, read on its files without running a pipeline (ms), so the
record rules are checked with the CLI's own reader configuration (columns, limits, TABs, skipping).
"""

import collections
import os

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from dp_partition_beam.pipelines import cli
from dp_partition_beam.pipelines import io as pio

IN_MEMORY = ["--direct_running_mode", "in_memory", "--progress_interval", "0"]


def select_argv(input_path, out_dir, *extra, fmt="tsv", algorithm="basic", epsilon=5, delta=1e-4, max_contributions=4):
    """``dp-select-partitions`` writing ``out_dir/items-*`` and ``out_dir/report.json`` (None: flag not given)."""
    flags = {"--algorithm": algorithm, "--epsilon": epsilon, "--delta": delta, "--max_contributions": max_contributions}
    return [
        *["--input", str(input_path), "--input_format", fmt],
        *["--output", os.path.join(str(out_dir), "items"), "--report", os.path.join(str(out_dir), "report.json")],
        *[str(a) for kv in flags.items() if kv[1] is not None for a in kv],
        *IN_MEMORY,
        *map(str, extra),
    ]


def ngrams_argv(input_path, out_dir, *extra, fmt="jsonl", epsilon=4, delta=1e-5, max_n=2, max_contributions=5):
    """``dp-extract-ngrams`` writing ``out_dir/ngrams-*`` and ``out_dir/report.json`` (None: flag not given)."""
    flags = {"--epsilon": epsilon, "--delta": delta, "--max_n": max_n, "--max_contributions": max_contributions}
    return [
        *["--input", str(input_path), "--input_format", fmt],
        *["--output", os.path.join(str(out_dir), "ngrams"), "--report", os.path.join(str(out_dir), "report.json")],
        *[str(a) for kv in flags.items() if kv[1] is not None for a in kv],
        *IN_MEMORY,
        *map(str, extra),
    ]


def bayes_argv(private, public, out_dir, *extra, fmt="jsonl", mechanism="laplace", epsilon=2, n=2):
    """``dp-bayesian-ngrams`` writing ``out_dir/probs-*`` and ``out_dir/report.json``."""
    return [
        *["--private", str(private), "--input_format", fmt, "--public", str(public)],
        *["--output", os.path.join(str(out_dir), "probs"), "--report", os.path.join(str(out_dir), "report.json")],
        *["--n", str(n), "--mechanism", mechanism, "--epsilon", str(epsilon)],
        *IN_MEMORY,
        *map(str, extra),
    ]


def released(out_dir, prefix):
    """The sorted lines of the release shards ``out_dir/prefix-*``."""
    paths = sorted(p for p in os.listdir(out_dir) if p.startswith(prefix + "-")) if os.path.isdir(out_dir) else []
    return sorted(
        line.rstrip("\n")
        for p in paths
        for line in open(os.path.join(out_dir, p), encoding="utf-8")  # noqa: SIM115
    )


def snapshot(root):
    """path -> (size, mtime) of every file under ``root``."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            out[path] = (st.st_size, st.st_mtime_ns)
    return out


def run_fails(capsys, root, run, argv, message):
    """Runs a CLI in process that must fail on its input: exit 3, exactly ``error: message`` as its only
    error line, no traceback or Beam error record, and no file under ``root`` written or changed."""
    capsys.readouterr()
    before = snapshot(root)
    code = run(argv)
    err = capsys.readouterr().err
    assert code == 3, err
    assert [line for line in err.splitlines() if line.startswith("error")] == [f"error: {message}"], err
    assert "Traceback" not in err and "ERROR" not in err, err
    assert snapshot(root) == before


class _Built(Exception):
    """Stops ``build_pipeline`` once the reader is built (the rest of the job is not needed)."""


class CliReader:
    """The private-input reader (``ReadRecordBatches``) that ``module``'s CLI builds for ``argv``.

    The argv is parsed by the CLI's own parser and ``params_from_args``, and ``module.build_pipeline`` is
    called as the CLI calls it, until it constructs its ``ReadRecordBatches`` (so with the arguments the CLI
    passes: columns, limits, TABs, skipping); the rest of the job is not built (its calibration costs
    seconds). :meth:`read` then runs that transform's file split and reader on the files its pattern
    matches, in process, as its Beam steps do (``MatchFiles`` -> ``_split_file`` -> the reader).
    """

    def __init__(self, module, argv):
        args, beam_args = module.build_parser().parse_known_args(argv)
        cli.absolute_local_paths(args)
        params = module.params_from_args(args)
        built, real = [], module.ReadRecordBatches

        def capture(*a, **kw):
            built.append(real(*a, **kw))
            raise _Built

        module.ReadRecordBatches = capture
        try:
            module.build_pipeline(beam.Pipeline(options=PipelineOptions(beam_args)), args, params)
        except _Built:
            pass
        finally:
            module.ReadRecordBatches = real
        assert len(built) == 1, "build_pipeline built no ReadRecordBatches"
        self.transform = built[0]
        self.pattern = self.transform._pattern  # noqa: SLF001

    def read(self):
        """``(Counter of (user, value) records, skipped bad records)`` of the CLI's input; raises what its
        reader raises (``BadRecordError``, ``InputFileError``)."""
        t = self.transform
        records, bad = collections.Counter(), 0
        matches = FileSystems.match([self.pattern])[0].metadata_list
        assert matches, f"no file matches {self.pattern}"
        for metadata in sorted(matches, key=lambda m: m.path):
            for piece in pio._split_file(metadata, t._format, t._block_bytes):  # noqa: SLF001
                for out in t._reader.read(piece):  # noqa: SLF001
                    if isinstance(out, int):
                        bad += out
                    else:
                        records.update(pio.batch_records(out))
        return records, bad

    def error(self):
        """The message of the error the reader raises on the CLI's input (fails if it raises none)."""
        try:
            self.read()
        except (pio.BadRecordError, pio.InputFileError) as e:
            return str(e)
        raise AssertionError(f"{self.pattern}: read without an error")
