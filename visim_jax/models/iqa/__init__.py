"""Ten classical full-reference image-quality metrics (issue 47), one module each, calibrated against piq 0.8.0
(tests/test_metrics_iqa.py; docs/metrics.md has the fidelity table). Every function takes two NHWC RGB batches of
the same shape, float in [0, 1] (or uint8), the DISTORTED image first and the REFERENCE second (piq's order; only
VIF-p, MDSI and IW-SSIM are asymmetric), and returns (N,) float32 computed from each pair alone.

The registry below is the one place a metric is named: `METRICS[name]` gives its function, its variants (the first
is the default: piq's choices) and its direction; the zoo (`vj.load(name)`, `config.models`) and the benchmark read
it. Adding a metric = its module + one line here + its test (docs/extending.md).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp

from visim_jax.models.iqa import dss, fsim, gmsd, haarpsi, iw_ssim, mdsi, ops, srsim, vif, vsi


@dataclasses.dataclass(frozen=True)
class Metric:
  fn: Callable                       # (distorted, reference, options) -> (N,)
  variants: dict                     # name -> options; the first is the default
  higher_is_more_similar: bool


METRICS = {
    'fsim': Metric(fsim.fsim, {'piq': fsim.FSIMOptions(), 'grey': fsim.FSIMOptions(chromatic=False),
                               'paper': fsim.FSIMOptions(matlab=True)}, True),
    'gmsd': Metric(gmsd.gmsd, {'piq': gmsd.GMSDOptions(), 'paper': gmsd.GMSDOptions(ddof=1)}, False),
    'ms_gmsd': Metric(gmsd.ms_gmsd, {'piq': gmsd.MSGMSDOptions(), 'chromatic': gmsd.MSGMSDOptions(chromatic=True)},
                      False),
    'vif_p': Metric(vif.vif_p, {'piq': vif.VIFOptions()}, True),
    'haarpsi': Metric(haarpsi.haarpsi, {'piq': haarpsi.HaarPSIOptions()}, True),
    'mdsi': Metric(mdsi.mdsi, {'piq': mdsi.MDSIOptions(), 'mult': mdsi.MDSIOptions(combination='mult')}, False),
    'vsi': Metric(vsi.vsi, {'piq': vsi.VSIOptions(), 'paper': vsi.VSIOptions(matlab=True)}, True),
    'srsim': Metric(srsim.srsim, {'piq': srsim.SRSIMOptions(), 'chromatic': srsim.SRSIMOptions(chromatic=True)},
                    True),
    'dss': Metric(dss.dss, {'piq': dss.DSSOptions()}, True),
    'iw_ssim': Metric(iw_ssim.iw_ssim, {'piq': iw_ssim.IWSSIMOptions()}, True),
}


def distance(name: str, opts) -> Callable:
  """The zoo's distance (smaller = more similar) of a metric as a pure function (reference, candidate) -> (N,)
  (the zoo's order; the metric gets (candidate, reference)): 1 - s for a similarity, the metric itself for GMSD,
  MS-GMSD and MDSI. A pair of identical images gets exactly 0, as classical.distance."""
  m = METRICS[name]

  def d(ref, cand):
    ref, cand = ops.unit(ref), ops.unit(cand)
    v = m.fn(cand, ref, opts)
    v = 1.0 - v if m.higher_is_more_similar else v
    same = jnp.all(ref == cand, axis=tuple(range(1, ref.ndim)))
    return jnp.where(same, jnp.zeros((), v.dtype), v)
  return d
