"""Building blocks shared by every family: the randomness contract, exact sums, contribution bounding,
noise and threshold, joins of per-item values back to users, and text helpers.

Importing it makes this process's Beam SDK harness free each step's output buffer when its bundle ends and
sample the running step every few ms instead of up to 200 ms, and Beam's FnApiRunner send a bundle's input
in chunks (:mod:`transforms.core.harness`): every process that runs one of our DoFns imports this package
first."""

from dp_partition_beam.transforms.core.harness import chunk_runner_input, release_output_buffers, shorten_state_sampling

release_output_buffers()
chunk_runner_input()
shorten_state_sampling()
