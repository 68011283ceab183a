"""Small seeded runs of every registered pipeline on a cut of its bundled sample (shared by tests)."""

import gzip
import os
import subprocess
import sys

from dp_partition_beam.pipelines import registry

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# tsv: ~195 users of data/debian_words.tsv.gz (sorted by user), enough for the seeded mad2r demo run to
# release items (5 under seed 11), so comparisons between runners are not vacuous.
SAMPLE_LINES = {"tsv": 24000, "jsonl": 600, "parquet": None}
SEED = 11


def cut_sample(spec, tmp_path, dst=None, lines=None):
    """The first ``lines`` lines (default: SAMPLE_LINES of its format) of the pipeline's bundled sample, as a
    plain file in its format at ``dst`` (default: ``tmp_path/sample.<format>``); its path."""
    src = os.path.join(REPO, spec.sample_input)
    dst = tmp_path / f"sample.{spec.input_format}" if dst is None else dst
    lines = SAMPLE_LINES[spec.input_format] if lines is None else lines
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rt", encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for n, line in enumerate(f):
            if n >= lines:
                break
            out.write(line)
    return str(dst)


def sample_args(spec):
    """The registry's sample arguments with data/ paths made absolute (tests run from any cwd)."""
    return [os.path.join(REPO, a) if a.startswith("data/") else a for a in spec.sample_args]


def cli_args(spec, input_path, out_dir, *extra):
    return [
        f"--{spec.input_flag}",
        input_path,
        "--input_format",
        spec.input_format,
        "--output",
        os.path.join(out_dir, "released"),
        "--report",
        os.path.join(out_dir, "report.json"),
        *sample_args(spec),
        "--seed",
        str(SEED),
        *extra,
    ]


def run_cli(spec, argv, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", f"dp_partition_beam.pipelines.{spec.name}", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def released_lines(out_dir):
    import glob

    return sorted(
        l.rstrip("\n") for p in glob.glob(os.path.join(out_dir, "released*")) for l in open(p, encoding="utf-8")
    )


PIPELINES = registry.PIPELINES
IDS = [s.name for s in PIPELINES]


#: A value for each CLI flag whose default is None (unset: the algorithm's own default), for tests that
#: pass every flag once (tests/pipelines/test_cli_strict.py, test_templates.py).
UNSET_FLAG_EXAMPLES = {
    "budget_split": "0.5,0.5",
    "c_ub": "2",
    "cap_quantile": "0.9",
    "cap_budget": "0.005",
    "weight_cap": "auto",
    "threshold": "gaussian",
    "dpsu_single_length": "2",
    "S": "0.01",
    "rho": "0.3",
}
