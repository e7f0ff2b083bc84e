"""Settings groups of the matchers, each declared once with its defaults and ranges.

The Hydra schema (glmc.config's `symmetry` and `multi`, glmc.settings.methods' `matcher.<method>`)
and the settings the training modules run with (glmc.matching.learned_module.LearnedSettings,
glmc.matching.universe_learned.UniverseLearnedSettings) are these dataclasses or subclasses that
add no defaults of their own, so `run.py`, `glmc.align` and the Python classes start from the same
values, and are checked by the same declarations (glmc.settings.ranges). Where a run.py config wants
another value it says so in conf/ (tests/test_settings.py lists every such patch).

This module imports nothing of glmc but the choices and the ranges, so the config schema, the method
registry and the matchers can all import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from glmc.choices import HeadForm, LambdaScheme, ResidualClass, UnitClass
from glmc.settings.ranges import setting


@dataclass
class SymmetryConfig:
    """Which symmetry spaces are used, and in which class (paper 001 Table 1)."""

    name: str = "auto"
    residual: ResidualClass = ResidualClass.auto
    heads: UnitClass = UnitClass.permutation
    qk: HeadForm = HeadForm.circuit
    vo: HeadForm = HeadForm.circuit
    mlp: UnitClass = UnitClass.permutation


@dataclass
class LearnedTraining:
    """Training settings of pairwise learned matching (paper 001 §4.2), `matcher.<learned method>.*`.
    Defaults as the width-64 digits ablations (Figs. 8 and 9) use them; the demo's config sets 600
    steps at lr 0.01 (docs/experiments.md, "Choosing the demo model"); paper 001 trains CIFAR-10 with lr 3e-4 and
    lambda_scheme uniform_mid for 5 epochs."""

    max_steps: int = setting(1500, "count")
    lr: float = setting(0.3, "lr")
    weight_decay: float = setting(0.01, "nonnegative")
    warmup_fraction: float = setting(0.05, "fraction")
    lambda_scheme: LambdaScheme = LambdaScheme.gaussian
    # draws of lambda per step; >1 trains at the draw whose batch loss exceeds the endpoints' line the most
    lambda_candidates: int = setting(1, "count")
    init_noise: float = setting(1e-3, "nonnegative")  # std of the Gaussian added to the initial latents
    sinkhorn_iters: int = setting(20, "count")
    sinkhorn_temperature: float = setting(1.0, "positive")
    # Appendix D: P_init = P_WM + noise * sqrt(2 / (n + m)) * |N(0, 1)|
    sinkhorn_noise: float = setting(0.01, "nonnegative")
    checkpoint_every: int = setting(50, "count")
    seed: int = setting(0, "seed")  # latent noise and the lambda sequence
    # after every epoch, log the midpoint's test loss (match_test_loss) on this many test batches; -1: all, 0: off
    epoch_test_batches: int = setting(16, "batches_or_all")
    # where each step's hard permutations are solved: host (SciPy), device (the certified auction of
    # glmc.matching.device_assignment, on the latents' device) or auto (device for CUDA latents, else host)
    assignment: str = setting("auto", choices=("auto", "host", "device"))


EDGE_LAMBDAS = ("uniform", "gaussian")


@dataclass
class UniverseTraining:
    """Training settings of the learned universe refinement (paper 001 §4.3), `multi.*` in run.py.

    concentration: the Dirichlet parameter of the merge coefficients; 1.0 is uniform over the
    simplex, larger values concentrate the draws near the centroid, smaller ones near the vertices.
    edge_share: the share of steps whose coefficients lie on an edge of the simplex (two models)
    instead: a Dirichlet draw almost never lands there, yet Eq. 2's maximum often sits on an edge.
    edge_lambda: where on that edge, one of EDGE_LAMBDAS: "uniform" (lambda ~ U(0, 1)) or "gaussian"
    (N(0.5, 0.1) clipped to [0, 1], pairwise learned matching's scheme: the edge's midpoint is where
    its barrier sits). The defaults draw from the Dirichlet alone; conf/config.yaml sets edge_share
    0.5 and gaussian edges for run.py, as measured on digits (docs/experiments.md). candidates: draws of the
    coefficients per step; with more than one, the step trains at the draw whose batch loss lies
    furthest above the members' losses combined by it (Eq. 2's excess)."""

    max_steps: int = setting(1500, "count")
    lr: float = setting(0.3, "lr")
    weight_decay: float = setting(0.01, "nonnegative")
    warmup_fraction: float = setting(0.05, "fraction")
    concentration: float = setting(1.0, "positive")  # Dirichlet(concentration * 1): 1 is uniform over the simplex
    edge_share: float = setting(0.0, "share")
    edge_lambda: str = setting("uniform", choices=EDGE_LAMBDAS)
    candidates: int = setting(1, "count")
    init_noise: float = setting(1e-3, "nonnegative")
    checkpoint_every: int = setting(50, "count")
    seed: int = setting(0, "seed")
