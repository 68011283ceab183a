import logging
import os
import random

import pytest

# benchmarks.shared_data: the one place that says where the large real corpora are read from
# (DP_SHARED_DATA, else ../shared/data); never copied into the repository.
from benchmarks.shared_data import shared_data_path

from tests.support.user_sets import random_user_sets

# Beam prints an apitools warning on import in environments without the gcp extra.
logging.getLogger("root").setLevel(logging.ERROR)


@pytest.fixture
def small_sets():
    return random_user_sets(random.Random(7), 400, 120, 12)


@pytest.fixture(scope="session")
def shared_data():
    """``shared_data(name)``: path of a file of the shared data folder; fails (naming the file and
    DP_SHARED_DATA) if it is absent, never skips."""
    return shared_data_path


# --- tiers --------------------------------------------------------------------------------------------
# `./run_local.sh test --quick` runs -m "not slow and not engines": what a developer runs between commits
# (a few minutes on 2 cores). It keeps the privacy math and kernels, the layer rules and lint, the strict
# CLI flags, the API entry checks, Beam == reference on small data and one output-contract run. The
# full suite (`./run_local.sh test`, what CI runs) keeps every test, the guarantee tests included.
# `slow` is set here by path, from measured durations (pytest --durations=0 on the 2-core machine): a
# file listed in SLOW_FILES is slow except the tests named in QUICK_TESTS; SLOW_TESTS are single slow
# tests of otherwise quick files. Paths are relative to tests/.
SLOW_FILES = frozenset(
    [
        # the guarantees: audit, randomness, side channels, fault tolerance, bad input, golden outputs
        "guarantees/test_bad_input.py",
        "guarantees/test_fault_tolerance.py",
        "guarantees/test_privacy_audit.py",
        "guarantees/test_secure_randomness.py",
        "guarantees/test_seeded_golden.py",
        "guarantees/test_side_channels.py",
        # CLIs end to end (most in subprocesses), readers on real files, templates, submission
        "pipelines/test_cli_bayesian.py",
        "pipelines/test_cli_common.py",
        "pipelines/test_cli_counts.py",
        "pipelines/test_cli_select.py",
        "pipelines/test_io_batches.py",
        "pipelines/test_observability.py",
        "pipelines/test_output_contract.py",
        "pipelines/test_profile.py",
        "pipelines/test_readers_verified.py",
        "pipelines/test_submission.py",
        "pipelines/test_templates.py",
        # Beam == reference sweeps over shards, batches and algorithms; multi_processing
        "transforms/core/test_foundation_beam.py",
        "transforms/selection/test_counts_beam.py",
        "transforms/selection/test_mad_beam.py",
        "transforms/selection/test_mad_sips_beam.py",
        "transforms/selection/test_multiprocessing.py",
        "transforms/selection/test_policy_beam.py",
        "transforms/dpne/test_dpne_beam.py",
        "transforms/dpne/test_dpne_batches.py",
        "transforms/dpne/test_dpne_counts.py",
        "transforms/dpne/test_dpne_reference.py",
        "transforms/bayesian/test_bayesian_beam.py",
        # benchmark smoke runs (and the bench extra's peers, absent from the minimum-versions lane), the
        # bundled data's rebuild, the portable job service
        "benchmarks/test_benchmarks_quick.py",
        "benchmarks/test_bench_cli.py",
        "benchmarks/test_peer_opendp.py",
        "data/test_bundled_data.py",
        "engines/test_portable_runner.py",
    ]
)
QUICK_TESTS = frozenset(
    [
        # the output contract: its checks before anything runs, its units, one real CLI run
        "pipelines/test_output_contract.py::test_contract_violations_stop_before_anything_runs",
        "pipelines/test_output_contract.py::test_contract_units",
        "pipelines/test_output_contract.py::test_report_lists_the_shards_of_its_release",
        # --profile: its grouping and its writing on fabricated counters (the CLI runs are slow)
        "pipelines/test_profile.py::test_stage_group_cuts_at_the_depth_and_after_numbered_steps",
        "pipelines/test_profile.py::test_counters_are_read_summed_grouped_and_sorted",
        "pipelines/test_profile.py::test_overhead_is_clamped_and_explained_when_workers_overlap",
        "pipelines/test_profile.py::test_a_runner_without_counters_gives_empty_stages_and_a_note",
        "pipelines/test_profile.py::test_a_profile_that_cannot_be_written_only_warns",
        "pipelines/test_profile.py::test_profile_path_is_checked_like_the_other_outputs",
    ]
)
SLOW_TESTS = frozenset(
    [
        "pipelines/test_cli_strict.py::test_the_real_command_prints_no_usage_block_but_help_does",
        "privacy/test_adaptive_cap.py::test_beam_equals_reference_with_the_adaptive_cap",
        "transforms/selection/test_select.py::test_batch_input_equals_element_input_and_the_reference",
        "transforms/selection/test_mad_kernels.py::test_l2_sensitivity_tight_cases",
        "transforms/test_api_types.py::test_bayesian_report_guarantee_kind_private_flag_and_warning",
        "transforms/test_api_types.py::test_extract_ngrams_cli_prints_one_line_for_a_bad_tokenizer",
    ]
)


# The longest files first (measured, pytest --durations=0 with -n 2): pytest-xdist's --dist loadfile hands
# out files in collection order, so starting the long ones first keeps one long file from running alone
# at the end (longest-processing-time-first). Order within a file is unchanged; files are independent.
LONGEST_FIRST = (
    "guarantees/test_bad_input.py",
    "pipelines/test_readers_verified.py",
    "transforms/selection/test_mad_beam.py",
    "guarantees/test_seeded_golden.py",
    "pipelines/test_io_batches.py",
    "pipelines/test_wheel.py",
    "pipelines/test_output_contract.py",
    "transforms/dpne/test_dpne_batches.py",
    "guarantees/test_fault_tolerance.py",
    "pipelines/test_cli_select.py",
    "pipelines/test_cli_common.py",
    "guarantees/test_privacy_audit.py",
    "transforms/dpne/test_dpne_beam.py",
    "benchmarks/test_benchmarks_quick.py",
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    rank = {}
    for item in items:
        rel = os.path.relpath(str(item.path), tests_dir).replace(os.sep, "/")
        name = item.originalname or item.name
        if (rel in SLOW_FILES and f"{rel}::{name}" not in QUICK_TESTS) or f"{rel}::{name}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        rank[item] = LONGEST_FIRST.index(rel) if rel in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank.__getitem__)  # stable: the other files and every file's tests keep their order
