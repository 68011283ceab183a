"""Building blocks shared by every family: the randomness contract, exact sums, contribution bounding,
noise and threshold, joins of per-item values back to users, and text helpers.

Importing it makes this process's Beam SDK harness free each step's output buffer when its bundle ends
(:func:`transforms.core.harness.release_output_buffers`): every process that runs one of our DoFns
imports this package first."""

from dp_partition_beam.transforms.core.harness import release_output_buffers

release_output_buffers()
