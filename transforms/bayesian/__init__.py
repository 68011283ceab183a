"""Bayesian DP n-gram distributions with a public prior (pure kernels, Beam transform, reference).
The public entry point is :class:`transforms.BayesianNgrams`."""
