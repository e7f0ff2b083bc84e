"""Settings groups of the matchers, each declared once with its defaults and ranges: the Hydra schema and the
training modules' settings are these dataclasses (or subclasses without defaults of their own), so run.py,
glmc.align and the Python classes start from the same values; conf/ states where run.py differs."""

from __future__ import annotations

from dataclasses import dataclass

from glmc.choices import HeadForm, LambdaScheme, ResidualClass, UnitClass
from glmc.ranges import setting


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
    """Training settings of pairwise learned matching (paper 001 §4.2), `matcher.<learned method>.*`."""

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
    # where each step's permutations are solved: host (SciPy), device (glmc.matching.engine.device_assignment) or auto
    assignment: str = setting("auto", choices=("auto", "host", "device"))


EDGE_LAMBDAS = ("uniform", "gaussian")


@dataclass
class UniverseTraining:
    """Training settings of the learned universe refinement (paper 001 §4.3), `multi.*`: edge_share is the share
    of steps on an edge of the simplex (where Eq. 2's maximum often sits, and a Dirichlet draw almost never),
    at edge_lambda "uniform" or "gaussian"; the step trains at the draw (of `candidates`) of largest excess."""

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
