"""Setup for dp-partition-beam: user-level DP partition selection and n-gram extraction on Beam."""

import setuptools

_TOP = ("privacy", "transforms", "pipelines")
# every package under the three folders, e.g. "transforms.core" (installed as dp_partition_beam.transforms.core)
_PACKAGES = setuptools.find_packages(include=[n for t in _TOP for n in (t, f"{t}.*")])

setuptools.setup(
    name="dp-partition-beam",
    version="0.1.0",
    description=(
        "User-level differentially private partition selection (Basic, MAD, MAD2R, DP-SIPS) "
        "and n-gram extraction (DPNE) as Apache Beam pipelines"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    # Tested on Python 3.11 only (the one Python of the development machines and CI); 3.11 is also the
    # oldest Python the minimum versions below were found on (README, "Install").
    python_requires=">=3.11",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "License :: OSI Approved :: Apache Software License",
    ],
    # The repository keeps privacy/, transforms/ and pipelines/ at the top level; installed, they are
    # dp_partition_beam.privacy, .transforms and .pipelines (dp_partition_beam is a namespace package:
    # no top-level name of ours but dp_partition_beam lands in site-packages).
    packages=[f"dp_partition_beam.{p}" for p in _PACKAGES],
    package_dir={f"dp_partition_beam.{top}": top for top in _TOP},
    # Lower bounds: the oldest versions that pass on Python 3.11, pinned in constraints/minimum.txt (the
    # minimum-versions lane of ./run_local.sh test installs exactly those; a test checks the two agree).
    install_requires=[
        "apache-beam>=2.51.0",
        "numpy>=1.23.2",
        "scipy>=1.9.2",
        "pyarrow>=10.0.1",
    ],
    entry_points={
        "console_scripts": [
            "dp-select-partitions=dp_partition_beam.pipelines.select_partitions:main",
            "dp-extract-ngrams=dp_partition_beam.pipelines.extract_ngrams:main",
            "dp-bayesian-ngrams=dp_partition_beam.pipelines.bayesian_ngrams:main",
            "dp-bayesian-eval=dp_partition_beam.pipelines.bayesian_eval:main",
            "dp-verify-release=dp_partition_beam.pipelines.verify:main",
        ]
    },
    extras_require={
        "test": [
            "pytest>=7.0",
            "hypothesis>=6.80",
            "dp-accounting>=0.4.3",
            "mpmath>=1.2",
            "matplotlib>=3.7",
            "ruff==0.17.6",  # pinned: lint rules and format style change between ruff releases
            "pytest-xdist>=3.5",  # ./run_local.sh test runs the main suite on 2 processes (-n 2)
            "pytest-timeout>=2.2",  # a per-test timeout (pyproject.toml): a hang fails, never stalls CI
        ],
        "gcp": ["apache-beam[gcp]>=2.51.0"],
        "plots": ["matplotlib>=3.7"],
        # Peers for benchmarks/run_all.py: PipelineDP's select_partitions on the same Beam runner, and
        # OpenDP's Polars key release in one process (benchmarks/peer_opendp.py; 0.16.0 is the tested one,
        # its polars extra pins Polars).
        "bench": ["pipeline-dp>=0.3.1", "python-dp>=1.1.5,<2", "opendp[polars]>=0.16.0", "matplotlib>=3.7"],
    },
)
