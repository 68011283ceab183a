"""Setup for dp-partition-beam: user-level DP partition selection and n-gram extraction on Beam."""

import setuptools

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
    python_requires=">=3.9",
    packages=setuptools.find_packages(
        include=["privacy", "privacy.*", "transforms", "transforms.*", "pipelines", "pipelines.*"]
    ),
    install_requires=[
        "apache-beam>=2.50.0",
        "numpy>=1.24",
        "scipy>=1.10",
        "pyarrow>=12.0",
    ],
    entry_points={
        "console_scripts": [
            "dp-select-partitions=pipelines.select_partitions:main",
            "dp-extract-ngrams=pipelines.extract_ngrams:main",
            "dp-bayesian-ngrams=pipelines.bayesian_ngrams:main",
            "dp-bayesian-eval=pipelines.bayesian_eval:main",
            "dp-verify-release=pipelines.verify:main",
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
        ],
        "gcp": ["apache-beam[gcp]>=2.50.0"],
        "plots": ["matplotlib>=3.7"],
        # Peers for benchmarks/run_all.py (PipelineDP's select_partitions on the same Beam runner).
        "bench": ["pipeline-dp>=0.3.1", "python-dp>=1.1.5,<2", "matplotlib>=3.7"],
    },
)
