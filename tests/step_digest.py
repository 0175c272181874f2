"""Compact digests of per-variable arrays (gradients, updated weights).

A full-size network has tens of millions of values; the training-step
references keep, per variable, its sum, L2 norm, largest magnitude and the
values at a few fixed positions (chosen from the variable's name), which is
enough to catch any systematic difference at a few kB per configuration.
Pure numpy: the recorder that runs the original imports it too.
"""
import zlib

import numpy as np

SAMPLES = 24


def sample_positions(name, size, count=SAMPLES):
  """Fixed flat positions of a variable of `size` values (sorted, unique)."""
  rng = np.random.default_rng(zlib.crc32(name.encode()))
  if size <= count:
    return np.arange(size)
  return np.sort(rng.choice(size, count, replace=False))


def digest(name, array):
  """float64 [3 + SAMPLES]: sum, L2 norm, max |x|, then the sampled values
  (nan-padded for variables with fewer values)."""
  flat = np.asarray(array, np.float64).ravel()
  out = np.full(3 + SAMPLES, np.nan)
  out[:3] = [flat.sum(), np.sqrt(np.square(flat).sum()), np.abs(flat).max()]
  samples = flat[sample_positions(name, flat.size)]
  out[3:3 + samples.size] = samples
  return out


def digests(named_arrays):
  """{name: digest} of {name: array}."""
  return {name: digest(name, a) for name, a in named_arrays.items()}


def mismatches(got, want, rtol, scale_floors=None):
  """Names whose digests differ beyond `rtol`, with the worst error.

  Errors are relative to the variable's scale: the sum's and the norm's to
  its L2 norm (a sum of n values carries about sqrt(n) rounding errors of
  their size), the largest magnitude's and the samples' to max |x|.

  Args:
    got, want: {name: digest}.
    rtol: the allowed relative error.
    scale_floors: optional {name: smallest scale}: where a variable's values
      are only known to some absolute precision (an update smaller than the
      float32 spacing of the weights it changes), errors are relative to
      at least that.

  Returns:
    A list of (relative error, name), worst first; empty when all agree.
  """
  bad = []
  for name in sorted(want):
    w, g = want[name], got[name]
    floor = max((scale_floors or {}).get(name, 0.0), 1e-30)
    scale = np.full(len(w), max(abs(w[2]), floor))
    scale[:2] = max(w[1], floor)
    errors = np.abs(g - w) / scale
    if not np.array_equal(np.isnan(g), np.isnan(w)):
      errors = np.array([np.inf])
    worst = float(np.nanmax(errors))
    if not worst <= rtol:
      bad.append((worst, name))
  return sorted(bad, reverse=True)
