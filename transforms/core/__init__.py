"""Building blocks shared by every family: the randomness contract, exact sums, contribution bounding,
noise and threshold, joins of per-item values back to users, and text helpers."""
