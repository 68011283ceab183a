"""Seeded golden outputs on the bundled data: a guard that a change meant to keep the output keeps it.

Pinned, under a fixed seed, as the sha256 and number of the sorted released lines: the release of every
selection algorithm of :data:`privacy.selection.ALGORITHMS` and of the variants in ``SELECT_VARIANTS``
(the adaptive cap, released counts with and without ``min_users``, an allowlist, the rules given
explicitly: ``--threshold gaussian`` / ``laplace``, ``--weight_cap 1``) on data/debian_words.tsv.gz; of
every DPNE algorithm and variant of ``DPNE_CASES`` (keep tables, MAD weighting, MAD-SIPS levels, counts) on
data/debian_text.jsonl.gz; and of every Bayesian mechanism of ``BAYES_CASES`` with the public prior
data/bayesian_public_trigrams.tsv.gz. The values are NOT a known-correct answer, only "unchanged";
correctness is checked elsewhere (the Beam == reference tests, the audits). A change meant to change an
output (a new randomness contract, a fixed bug) updates its value here in the same commit and says why.

Each case is a command line: its flags are parsed by that CLI's own parser and ``params_from_args``
(the flag -> parameter mapping is the CLI's) and the release is computed by the in-memory reference
(:func:`transforms.reference.release`, ``dpne_reference``, ``bayesian_release``), which gives the
Beam transforms' output bit for bit under the same seed; the allowlist and the public prior are read by
the CLI's readers. That the CLIs release exactly what the reference computes is tied by one CLI run per
algorithm shape (``CLI_TIES``: single round, DP-SIPS, MAD2R, MAD-SIPS, the sequential policies with their
sharded count join; DPNE's paper levels and MAD-SIPS levels with counts; the Bayesian mechanism and
Laplace) on a cut of the same data (24,000 tsv lines, the selection at epsilon 8; 600 jsonl lines),
compared line for line with the reference on the cut.

The values hold with the newest dependencies (the main suite's .venv). With the oldest supported ones
(constraints/minimum.txt, numpy 1.23.2, scipy 1.9.2) the selection and DPNE hashes hold too, but the
Bayesian mechanisms' released probabilities differ in the last digits (432 of 5,000 for ``laplace``, by at most 16
ulps: float rounding of the older stack), so the minimum-versions lane runs the quick tier, not this file.
"""

import gzip
import hashlib
import itertools
import json
import os

import pytest

from dp_partition_beam.pipelines import bayesian_ngrams, extract_ngrams, select_partitions
from dp_partition_beam.pipelines import io as pio
from dp_partition_beam.privacy.selection import ALGORITHMS
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.dpne.reference import user_kgrams

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORDS = os.path.join(REPO, "data", "debian_words.tsv.gz")  # 1,754 users, 199,954 (user, word) pairs
TEXT = os.path.join(REPO, "data", "debian_text.jsonl.gz")  # 1,000 users
PUBLIC = os.path.join(REPO, "data", "bayesian_public_trigrams.tsv.gz")  # 5,000 public trigrams
SEED = 11
EPSILON, DELTA, DELTA_0 = 2.0, 1e-4, 20
SELECT_ARGS = ["--epsilon", str(EPSILON), "--delta", str(DELTA)]
ALLOWLIST = "ALLOWLIST"  # replaced by the path of the allowlist fixture

#: name -> select_partitions flags besides the budget (Delta_0 is DELTA_0 unless given): every algorithm, and variants
SELECT_VARIANTS = {
    # MAD-SIPS's adaptive cap choosing a cap below Delta_0 (the reference's case checks that it does)
    "mad_sips_cap": ["--algorithm", "mad_sips", "--max_contributions", "100", "--cap_quantile", "0.5"],
    # the Gaussian last rounds, given explicitly since the keep tables became the defaults (issue 30): the
    # values recorded before that change
    "mad2r_counts": ["--algorithm", "mad2r", "--threshold", "gaussian", "--release_counts"],
    "dp_sips_counts_min_users": [
        *["--algorithm", "dp_sips", "--threshold", "gaussian", "--release_counts", "--min_users", "5"],
    ],
    "mad2r_gaussian": ["--algorithm", "mad2r", "--threshold", "gaussian"],
    "dp_sips_gaussian": ["--algorithm", "dp_sips", "--threshold", "gaussian"],
    # MAD-SIPS's adaptive cap, asked for (off by default with the keep table since issue 30): the former default
    # (with no weight cap, as before weight_cap 'auto' became the default)
    "mad_sips_cap98": ["--algorithm", "mad_sips", "--cap_quantile", "0.98", "--weight_cap", "1"],
    # MAD-SIPS without a weight cap: the default before weight_cap 'auto' (issue 30); the value recorded then
    "mad_sips_weight_cap1": ["--algorithm", "mad_sips", "--weight_cap", "1"],
    # Policy Gaussian's Gaussian rule given explicitly since the l2 keep rule became its default (issue 30): the
    # values recorded before that change
    "policy_gaussian_gaussian": ["--algorithm", "policy_gaussian", "--threshold", "gaussian"],
    "policy_gaussian_counts": ["--algorithm", "policy_gaussian", "--threshold", "gaussian", "--release_counts"],
    # the l2 rule with counts (composed in RDP), recorded when the rule became the default
    "policy_gaussian_rule_counts": ["--algorithm", "policy_gaussian", "--release_counts"],
    "basic_allowlist": ["--algorithm", "basic", "--allowlist", "ALLOWLIST"],
    # the Laplace rule given explicitly: the l1 keep curve became the Laplace algorithms' default (issue 30); the
    # values recorded before that change
    "policy_laplace_allowlist": ["--algorithm", "policy_laplace", "--threshold", "laplace", "--allowlist", "ALLOWLIST"],
    "weighted_laplace_laplace": ["--algorithm", "weighted_laplace", "--threshold", "laplace"],
    "count_laplace_laplace": ["--algorithm", "count_laplace", "--threshold", "laplace"],
    # count_gaussian's keep table became its default (issue 30): its Gaussian rule given explicitly
    "count_gaussian_gaussian": ["--algorithm", "count_gaussian", "--threshold", "gaussian"],
    "policy_laplace_laplace": ["--algorithm", "policy_laplace", "--threshold", "laplace"],
    # MAD's Gaussian rule given explicitly since the l2 keep rule became its default (issue 30): the value before
    "mad_gaussian": ["--algorithm", "mad", "--threshold", "gaussian"],
}

DPNE_ARGS = ["--max_n", "3", "--epsilon", "4", "--delta", "1e-6"]  # and --max_contributions 30 unless given
DPNE_CASES = {
    # the paper's levels (one weighted-Gaussian round each; given explicitly)
    "dpne": ["--algorithm", "dpne", "--selection", "single", "--threshold", "gaussian"],
    # keep tables at every level (the default since issue 30)
    "dpne_tables": ["--algorithm", "dpne"],
    "dpne_tables_counts": ["--algorithm", "dpne", "--release_counts"],
    "dpsu_all": ["--algorithm", "dpsu_all"],
    "dpsu_even": ["--algorithm", "dpsu_even"],
    "dpsu_single": ["--algorithm", "dpsu_single"],
    # at Delta_k 10: at 30 MAD's rerouting changes no decision on this sample, and the case would release what
    # "dpne" does (it did until issue 59, when the spurious draws stopped depending on the support's size)
    "dpne_mad": ["--algorithm", "dpne", "--selection", "single", "--weighting", "mad", "--max_contributions", "10"],
    "dpne_counts": ["--algorithm", "dpne", "--selection", "single", "--threshold", "gaussian", "--release_counts"],
    # MAD-SIPS's rounds inside every level (issue 30)
    "dpne_mad_sips": ["--algorithm", "dpne", "--selection", "mad_sips"],
    "dpne_mad_sips_counts": ["--algorithm", "dpne", "--selection", "mad_sips", "--release_counts"],
}

BAYES_ARGS = ["--public", PUBLIC, "--n", "3", "--C", "1", "--W", "100"]
DD = ["--mechanism", "bayesian_data_dependent", "--acknowledge_data_dependent"]
BAYES_CASES = {
    # the default since issue 59 (worst-case DP: noisy counts, then the posterior), S and rho given
    "bayesian": ["--mechanism", "bayesian", "--delta", "1e-5", "--epsilon", "8", "--S", "1e-3", "--rho", "0.5"],
    # the default with its choice of S, rho from the noisy counts (at epsilon 8 it picks a candidate here)
    "bayesian_choice": ["--mechanism", "bayesian", "--delta", "1e-5", "--epsilon", "8"],
    # the paper's mechanism (the default until issue 59, now opt-in): the same outputs as recorded before
    # issue 59 under the names bayesian and bayesian_choice
    "bayesian_data_dependent": [*DD, "--delta", "1e-5", "--epsilon", "1", "--S", "1e-3", "--rho", "0.1"],
    "bayesian_data_dependent_choice": [*DD, "--delta", "1e-5", "--epsilon", "8"],
    "laplace": ["--mechanism", "laplace", "--epsilon", "1"],
    "laplace_public": ["--mechanism", "laplace_public", "--acknowledge_data_dependent", "--epsilon", "1"],
}

#: sha256 of "\n".join(sorted released lines) and their number, per command and case
GOLDEN = {  # name: (sha256, number of lines)
    "bayesian_ngrams/bayesian": ("31eebc3a03a27286b72639d0b2e8cb215e017beb7ffe09b8e9af6752d6fbd9e6", 5000),
    "bayesian_ngrams/bayesian_choice": ("bac19dbde7c2160864df8d1e78e5df52483f4c3207662e28c22557aae7752b48", 5000),
    "bayesian_ngrams/bayesian_data_dependent": (
        "abd2f1ab65be4fe5c2052b67aed4c444a07777fd30c676e0acba38b1d6b98612",
        5000,
    ),
    "bayesian_ngrams/bayesian_data_dependent_choice": (
        "06253c44777f0320d2c1c48aee2738d82d2968421edd3d033cb8d15c3b6ec800",
        5000,
    ),
    "bayesian_ngrams/laplace": ("a316de7fec10fc2fc3369709258c1a028cb40f9d007a0d1fecd5404af5ae8169", 5000),
    "bayesian_ngrams/laplace_public": ("8b05f7429a60766330e33a116608bb36d08d29150c2f78be0e69f3de086e8ef1", 5000),
    "extract_ngrams/dpne": ("5b001b6cdd4882e09eb9ec45d1c896ae897611ec2795dfefa5ac4179ddf93fcc", 254),
    "extract_ngrams/dpne_counts": ("b3f77c7c2748ec9c0ebeaa532cc3ee93ab85a16da0b53f189823fcacc605ebc5", 219),
    "extract_ngrams/dpne_tables": ("225dd36931628ee89bdee4f0514ff34090bfd412ca7d4febf2384f5236d7ebcd", 279),
    "extract_ngrams/dpne_tables_counts": ("993337270f804458d7fffc29ee67e3d3aa2711befdd1bccf0b17450dde1bcf41", 247),
    "extract_ngrams/dpne_mad": ("e8754871c58e45211f2fff22d67b72eb1746d1b8686b662d59e6fbbd2e1312fc", 174),
    "extract_ngrams/dpne_mad_sips": ("ea46527ff779141aa2a599e3f9fb47ff9385e073457439b29ffe7b50da5ce8ca", 312),
    "extract_ngrams/dpne_mad_sips_counts": ("e85d673cfff1e5cef6ec4d2579b7b7a67ae1f1f7537b03517f810c57e2d83c93", 264),
    "extract_ngrams/dpsu_all": ("3c58eb5aa318536782b28baa17463e956fc85861062f9cc42af7e495c8958f9b", 79),
    "extract_ngrams/dpsu_even": ("c8d91e6ca13be04fa56d40a22908b0457138e2b922981a05bb7d2ba7e99dcc44", 87),
    "extract_ngrams/dpsu_single": ("7b19b990494ce631e35b89846f77fdccb96c9b98af1b9563922fdd1cb6bf257f", 9),
    "select_partitions/basic": ("036d7a9d35d49d5195b272c2666f333afd45e45b422847be60697eba648b392d", 126),
    "select_partitions/basic_allowlist": ("b36c32bbe7b5715c9d70fd9fcd8172fd4a41f0e429ab35535714ba4e49666d77", 178),
    "select_partitions/count_gaussian": (
        "b3b5d6066667a8e2321b16aedd422ddc99672ba6b1c7f99504f7b159c2e900e6",
        211,
    ),  # its keep table (issue 30)
    "select_partitions/count_laplace": (
        "29c830b12ce9a54d4193566e90dcb17569020f7ff56000a5bae490beacfb550b",
        48,
    ),  # the l1 keep curve (issue 30)
    "select_partitions/dp_sips": ("e938ffa52fcf6a0a1a3d637dcd058470f2ddb17cef1212c69e60663f93be9d77", 180),
    "select_partitions/dp_sips_counts_min_users": (
        "93fab06fe3ffc0fdd1094b476174d2f8ee356a4a41aa4b0dc1865008a89a4761",
        130,
    ),
    "select_partitions/mad": ("fa69f0de9deb58bad610261468e7cc81b34954ca5ec06e58a5d214933539afdc", 137),
    "select_partitions/mad_gaussian": ("9ba7be522803e4791246781e1677dcb75aaadc5e2439947ad5a9d777f9775136", 127),
    "select_partitions/mad2r": ("3c00844d4085b9a27bfd916a1bd4c3f431d655eb24927eb97afdeaae83f3b8aa", 159),
    "select_partitions/mad2r_counts": ("6dfb29279a95f46d9744c25f69b8350a0bf58d77532f14e417cedb9ec6a38bdb", 125),
    "select_partitions/mad_sips": ("7f612ee1a13fc3891ab599f37d2affd6ee663d033dfbab71a266280bcf791457", 238),
    "select_partitions/mad_sips_cap": ("7403a63ef9fd4d9e8b504878498d74a8e44f6d4982f6efe1672afdf94ab6d47b", 401),
    "select_partitions/policy_gaussian": ("350271c1893059b8977425d7506185aa9aa17354d0cddd4954ada0caa733276e", 140),
    "select_partitions/policy_gaussian_gaussian": (
        "95783e29ea36e7c25e7a4ecd531e317997f5ab84d0583d69b9c9e43918d20262",
        133,
    ),
    "select_partitions/policy_gaussian_rule_counts": (
        "54000538e3658c81f2e7e73b349ab280b8acde40ad52f96c59c8adbb17eef24a",
        124,
    ),
    "select_partitions/policy_gaussian_counts": (
        "8982f4c863f67e2fc21bcde1d85db33739659ad8720afb873f0d43ae31e714a7",
        114,
    ),
    "select_partitions/policy_laplace": (
        "cb4607baab5360a806fda6766f07c3de24d459b0300777704ef80e1783ec9886",
        64,
    ),  # the l1 keep curve (issue 30)
    "select_partitions/weighted_laplace_laplace": (
        "2feac70946fa317843d3d5b12e57352f7377ec729317f35b3f95b5926cdd70f0",
        48,
    ),  # --threshold laplace: the former default
    "select_partitions/count_laplace_laplace": (
        "a21ff0837cec42fa553245d4a8ba788532fd0b7477f8715539312578acdb2793",
        44,
    ),  # --threshold laplace: the former default
    "select_partitions/policy_laplace_laplace": (
        "64637b5063d250166eb698e7a4e16f0d70153f2232d85f391bf63ae871a4cd87",
        59,
    ),  # --threshold laplace: the former default
    "select_partitions/count_gaussian_gaussian": (
        "d910c32376c9fe6fe4bd7a641a59ce7f9cf20065be44fbb05f716ec87c8059d5",
        123,
    ),  # --threshold gaussian: the former default
    "select_partitions/policy_laplace_allowlist": (
        "a6d3012792340a801c93c71b87b390b47eeab713ed24d83add9473f7bf51f407",
        90,
    ),
    "select_partitions/mad2r_gaussian": ("3c68b7216a297e4d916f11cc8e862a4b2a53fa25a43b178ccddff1e660605cbf", 146),
    "select_partitions/dp_sips_gaussian": ("7f55c5e2a3d5f227f9492314babd417296b5c3c8f06cebe99e00d90d2ccb2e19", 161),
    "select_partitions/mad_sips_cap98": ("0ad8801a8169ae3e002cc6552c33d7bebc01b4c84d1fc9f4d105433a3bc1eadf", 203),
    "select_partitions/mad_sips_weight_cap1": ("25e696b419b88568756fa1bc7349eac554b6962138f50f909f84d317969a2c13", 205),
    "select_partitions/weighted_laplace": (
        "8a7ad9fbdc2092960bed60b9fb29ce0f8c3683c890704ce153a06a0da978750c",
        53,
    ),  # the l1 keep curve (issue 30)
}


SELECT_CASES = {**{algorithm: ["--algorithm", algorithm] for algorithm in ALGORITHMS}, **SELECT_VARIANTS}


def digest(lines):
    return hashlib.sha256("\n".join(sorted(lines)).encode("utf-8")).hexdigest()


def check(name, lines):
    lines = list(lines)
    assert lines, "a golden case that releases nothing would guard nothing"
    assert (digest(lines), len(lines)) == GOLDEN[name], f"{name}: the seeded output changed"


# --- a case's command line -> what its release is computed from ------------------------------------------


def select_argv(input_path, case, allowlist):
    extra = [allowlist if a == ALLOWLIST else a for a in SELECT_CASES[case]]
    if "--max_contributions" not in extra:
        extra += ["--max_contributions", str(DELTA_0)]
    return ["--input", input_path, "--input_format", "tsv", *SELECT_ARGS, *extra]


def dpne_argv(input_path, case):
    extra = (
        DPNE_CASES[case]
        if "--max_contributions" in DPNE_CASES[case]
        else [*DPNE_CASES[case], "--max_contributions", "30"]
    )
    return ["--input", input_path, "--input_format", "jsonl", *DPNE_ARGS, *extra]


def bayes_argv(input_path, case):
    return ["--private", input_path, "--input_format", "jsonl", *BAYES_ARGS, *BAYES_CASES[case]]


def parsed(module, argv):
    """(args, params) of ``argv`` as the CLI ``module`` reads them."""
    args, _ = module.build_parser().parse_known_args([*argv, "--output", "out/released", "--report", "out/r.json"])
    return args, module.params_from_args(args)


def select_lines(user_sets, argv):
    """The released lines of dp-select-partitions ``argv``, by the reference: items, or item<TAB>count."""
    args, params = parsed(select_partitions, argv)
    allowlist = list(pio.allowlist_entries(args.allowlist)) if args.allowlist else None
    result = reference.release(user_sets, args.algorithm, params, SEED, allowlist=allowlist)
    if params.release_counts:
        return [f"{item}\t{count}" for item, count in result.counts.items()], result
    return list(result.items), result


def dpne_lines(records, argv, user_grams=None):
    """The released lines of dp-extract-ngrams ``argv``, by the reference: k<TAB>n-gram[<TAB>count]."""
    args, params = parsed(extract_ngrams, argv)
    result = reference.dpne_reference(records, args.algorithm, params, seed=SEED, user_grams=user_grams)
    if params.release_counts:
        return [f"{k}\t{g}\t{c}" for k, per_k in result.counts.items() for g, c in per_k.items()]
    return result.lines()


def bayes_lines(texts, argv):
    """The released lines of dp-bayesian-ngrams ``argv``, by the reference: n-gram<TAB>probability."""
    args, params = parsed(bayesian_ngrams, argv)
    prior = pio.load_public_counts(args.public, params.n)
    probabilities, _ = reference.bayesian_release(texts, args.mechanism, prior, params, seed=SEED)
    return [bayesian_ngrams.format_probability(kv) for kv in probabilities.items()]


def read_pairs(path, lines=None):
    """The (user, item) pairs of the first ``lines`` lines (None: all) of a gzipped tsv with its header."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        head = list(itertools.islice(f, lines))
    assert head[0] == "user\titem\n"
    return [tuple(line.rstrip("\n").split("\t")) for line in head[1:]]


def read_texts(path, lines=None):
    """The (user, text) records of the first ``lines`` lines (None: all) of a gzipped jsonl."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in itertools.islice(f, lines)]
    return [(str(r["user"]), r["text"]) for r in rows]


def texts_by_user(records):
    texts = {}
    for user, text in records:
        texts.setdefault(user, []).append(text)
    return texts


@pytest.fixture(scope="module")
def user_sets():
    return reference.user_sets_from_pairs(read_pairs(WORDS))


@pytest.fixture(scope="module")
def text_records():
    return read_texts(TEXT)


@pytest.fixture(scope="module")
def allowlist(tmp_path_factory):
    """A public allowlist: the words of the public trigram prior (its users are not in the private data)."""
    with gzip.open(PUBLIC, "rt", encoding="utf-8") as f:
        words = sorted({w for line in f for w in line.split("\t")[0].split(" ")})
    path = tmp_path_factory.mktemp("allowlist") / "allowlist.txt"
    path.write_text("".join(w + "\n" for w in words), encoding="utf-8")
    return str(path)


# --- the golden values, by the reference ------------------------------------------------------------------


@pytest.mark.parametrize("case", list(SELECT_CASES))
def test_select_partitions_golden(user_sets, allowlist, case):
    lines, result = select_lines(user_sets, select_argv(WORDS, case, allowlist))
    if case == "mad_sips_cap":
        assert result.cap < 100  # the adaptive cap chose a cap below Delta_0
    check(f"select_partitions/{case}", lines)


def test_select_partitions_golden_values_differ():
    # every algorithm releases something else under the seed (a case run as another would show)
    assert len({GOLDEN[f"select_partitions/{algorithm}"] for algorithm in ALGORITHMS}) == len(ALGORITHMS)


@pytest.fixture(scope="module")
def text_grams(text_records):
    return user_kgrams(text_records, 3)  # DPNE_ARGS' --max_n 3, the default tokenizer


@pytest.mark.parametrize("case", list(DPNE_CASES))
def test_extract_ngrams_golden(text_records, text_grams, case):
    check(f"extract_ngrams/{case}", dpne_lines(text_records, dpne_argv(TEXT, case), text_grams))


@pytest.mark.parametrize("case", list(BAYES_CASES))
def test_bayesian_ngrams_golden(text_records, case):
    check(f"bayesian_ngrams/{case}", bayes_lines(texts_by_user(text_records), bayes_argv(TEXT, case)))


# --- the CLIs release what the reference computes: one run per algorithm shape, on a cut -------------------

CUT_TSV_LINES, CUT_JSONL_LINES = 24_000, 600  # 195 users of the words; 600 users of the texts
# the selection's ties at epsilon 8 rather than 2: 32-59 items released on the cut instead of 5-15, so more
# of them sit near the threshold, where a plumbing change (seed, params, rounds) moves the release
CUT_SELECT_EPSILON = "8"
#: name -> (command, case, extra flags): the flags of the case, plus execution options that must not change
#: the output (the sequential policies' sharded count join)
CLI_TIES = {
    "basic": ("select_partitions", "basic", []),
    "dp_sips": ("select_partitions", "dp_sips", []),
    "mad2r_counts": ("select_partitions", "mad2r_counts", []),
    "mad_sips": ("select_partitions", "mad_sips", []),
    "policy_gaussian_counts_join": (
        "select_partitions",
        "policy_gaussian_counts",
        ["--max_broadcast_items", "0", "--max_users_per_key", "3"],
    ),
    "dpne": ("extract_ngrams", "dpne", []),
    "dpne_mad_sips_counts": ("extract_ngrams", "dpne_mad_sips_counts", []),
    "bayesian_choice": ("bayesian_ngrams", "bayesian_choice", []),
    "laplace": ("bayesian_ngrams", "laplace", []),
}
MODULES = {"select_partitions": select_partitions, "extract_ngrams": extract_ngrams, "bayesian_ngrams": bayesian_ngrams}


def _cut(src, dst, lines):
    with gzip.open(src, "rt", encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        out.writelines(itertools.islice(f, lines))
    return str(dst)


def run_cli(module, argv, out_dir):
    prefix = os.path.join(out_dir, "released")
    code = module.run(
        [*argv, "--output", prefix, "--report", os.path.join(out_dir, "report.json"), "--seed", str(SEED)]
        + ["--direct_running_mode", "in_memory", "--progress_interval", "0"]
    )
    assert code == 0
    paths = sorted(p for p in os.listdir(out_dir) if p.startswith("released-"))
    return sorted(line.rstrip("\n") for p in paths for line in open(os.path.join(out_dir, p), encoding="utf-8"))


@pytest.mark.parametrize("tie", list(CLI_TIES))
def test_cli_releases_what_the_reference_computes(tmp_path, allowlist, tie):
    command, case, extra = CLI_TIES[tie]
    if command == "select_partitions":
        path = _cut(WORDS, tmp_path / "cut.tsv", CUT_TSV_LINES)
        argv = select_argv(path, case, allowlist)
        argv[argv.index("--epsilon") + 1] = CUT_SELECT_EPSILON
        want, _ = select_lines(reference.user_sets_from_pairs(read_pairs(WORDS, CUT_TSV_LINES)), argv)
    else:
        path = _cut(TEXT, tmp_path / "cut.jsonl", CUT_JSONL_LINES)
        records = read_texts(TEXT, CUT_JSONL_LINES)
        if command == "extract_ngrams":
            argv = dpne_argv(path, case)
            want = dpne_lines(records, argv)
        else:
            argv = bayes_argv(path, case)
            want = bayes_lines(texts_by_user(records), argv)
    got = run_cli(MODULES[command], [*argv, *extra], str(tmp_path / "out"))
    assert got == sorted(want) and got, tie
