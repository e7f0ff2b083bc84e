"""Learned matching: projections, lambda schemes, the dense apply, training, resume and DDP."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from glmc.choices import LambdaScheme
from glmc.data.module import DataModule
from glmc.eval.evaluator import evaluate_path, path_losses
from glmc.interpolation import merge_params
from glmc.matching.base import MatchContext
from glmc.matching.engine.projections import (
    polar,
    polar_factor,
    sinkhorn,
    sinkhorn_latent,
    straight_through_permutation,
)
from glmc.matching.learned import LearnedMatcher
from glmc.matching.learned_module import LearnedMatchingModule, LearnedSettings, sample_lambda
from glmc.matching.registry import build_matcher, method_config
from glmc.models import canonical_forward, to_canonical
from glmc.models.canonical import circuit_params
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply, apply_dense
from glmc.train.latent_fit import fit_latents
from glmc.train.trainer import trainer_factory

from conftest import compose_config
from numeric import FEW_OPS, FORWARD, assert_close_rel, assert_params_close_rel
from tiny_hf import tiny_gpt2, tiny_vit

TINY = dict(hidden=16, heads=2, mlp=32)


@pytest.fixture(scope="module")
def pair():
    return to_canonical(tiny_vit(0, **TINY)), to_canonical(tiny_vit(1, **TINY))


def config(tmp_path, *overrides):
    return compose_config(
        "debug=fast",
        "logger=none",
        f"cache_dir={tmp_path / 'endpoints'}",
        "matcher.learned.max_steps=12",
        "matcher.learned.lr=0.01",
        "matcher.learned.checkpoint_every=4",
        *overrides,
    )


def digits(cfg):
    data = DataModule(cfg.data, seed=0)
    data.setup()
    return data


def matcher(cfg, name):
    return build_matcher(method_config(cfg, name))


def context(cfg, data, run_dir, trainer=None):
    make = trainer or trainer_factory(cfg.trainer)
    return MatchContext(data=data, trainer=make, run_dir=run_dir, fit=fit_latents, path_loss=path_losses)


def test_straight_through_is_hard_forward_and_identity_backward():
    g = torch.Generator().manual_seed(0)
    p = Permutation.sample(6, g)
    latent = (p.dense() + 0.3 * torch.randn(6, 6, generator=g)).requires_grad_()
    out = straight_through_permutation(latent)
    assert torch.equal(out.detach(), p.dense())
    upstream = torch.randn(6, 6, generator=g)
    (out * upstream).sum().backward()
    assert torch.equal(latent.grad, upstream)


def test_polar_gradient_is_exact_and_finite_at_orthogonal_matrices():
    g = torch.Generator().manual_seed(0)
    for shape in ((5, 5), (7, 4)):
        a = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(polar, (a,))
    # the weight-matching start: every singular value is 1, where SVD's own backward divides by 0
    o = Orthogonal.sample(8, g).matrix.requires_grad_()
    (polar(o) * torch.randn(8, 8, generator=g)).sum().backward()
    assert torch.isfinite(o.grad).all() and o.grad.abs().sum() > 0


@pytest.mark.numeric
def test_polar_from_the_gram_matrix_or_the_svd_is_the_nearest_orthogonal_matrix():
    g = torch.Generator().manual_seed(0)
    near = Orthogonal.sample(64, g).matrix + 0.1 * torch.randn(64, 64, generator=g)  # the eigh route
    singular = torch.randn(64, 64, generator=g)
    singular[:, 0] = singular[:, 1] * (1 + 1e-6)  # sigma_min / sigma_max ~ 1e-7: the SVD route
    tall = torch.randn(80, 48, generator=g)
    for z in (near, singular, tall):
        if z is singular:  # the direction of the tiny singular value is float32's own: the same SVD's
            u, _, vh = torch.linalg.svd(z, full_matrices=False)
            expected = u @ vh
        else:
            expected = Orthogonal.project(z.double()).matrix
        assert_close_rel(polar(z), expected, FEW_OPS)
        q = polar(z).double()
        assert_close_rel(q.T @ q, torch.eye(z.shape[1], dtype=torch.float64), FEW_OPS)


@pytest.mark.numeric
def test_a_float64_polar_factor_takes_the_gram_route_down_to_a_condition_of_ten_thousand():
    g = torch.Generator().manual_seed(1)
    u = torch.linalg.qr(torch.randn(96, 96, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(96, 96, generator=g, dtype=torch.float64))[0]
    for condition, gram in ((3e3, True), (1e6, False)):
        a = u @ torch.diag(torch.logspace(0, -math.log10(condition), 96, dtype=torch.float64)) @ v.T
        q, served = polar_factor(a, True)
        assert served is gram
        assert_close_rel(q, u @ v.T, 1e-9)  # the exact polar factor of the constructed matrix
        assert_close_rel(q.T @ q, torch.eye(96, dtype=torch.float64), 1e-9)
    # float32 keeps the tighter bound: the same matrix at a condition of 3e3 goes to the SVD
    a32 = (u @ torch.diag(torch.logspace(0, -math.log10(3e3), 96, dtype=torch.float64)) @ v.T).float()
    assert polar_factor(a32, True)[1] is False


def test_sinkhorn_is_doubly_stochastic_and_starts_near_the_permutation():
    g = torch.Generator().manual_seed(0)
    p = sinkhorn(3 * torch.randn(7, 7, generator=g), iters=50)
    assert (p >= 0).all()
    assert torch.allclose(p.sum(0), torch.ones(7), atol=1e-5) and torch.allclose(p.sum(1), torch.ones(7), atol=1e-4)
    perm = Permutation.sample(7, g)
    soft = sinkhorn(sinkhorn_latent(perm.dense(), noise=0.02, generator=g), iters=100)
    assert torch.allclose(soft.sum(1), torch.ones(7), atol=1e-3)
    assert (soft - perm.dense()).abs().max() < 0.05
    assert torch.equal(Permutation.project(soft).perm, perm.perm)


def test_lambda_schemes_sample_in_range():
    g = torch.Generator().manual_seed(0)
    ranges = {
        "fixed": (0.5, 0.5),
        "uniform_mid": (0.4, 0.6),
        "uniform": (0.0, 1.0),
        "gaussian": (0.0, 1.0),
        "arcsine": (0.0, 1.0),
    }
    assert set(ranges) == set(LambdaScheme)
    for scheme, (lo, hi) in ranges.items():
        lams = torch.tensor([sample_lambda(scheme, g) for _ in range(2000)])
        assert lo <= lams.min() and lams.max() <= hi, scheme
        assert abs(lams.mean() - 0.5) < 0.03, scheme
    assert torch.tensor([sample_lambda("uniform", g) for _ in range(2000)]).std() > 0.25
    # the arcsine law: P(lambda < 0.1) = (2 / pi) asin(sqrt(0.1)) = 0.205, twice the uniform's share
    arcsine = torch.tensor([sample_lambda("arcsine", g) for _ in range(4000)])
    assert abs((arcsine < 0.1).double().mean() - 0.205) < 0.02
    assert abs((arcsine > 0.9).double().mean() - 0.205) < 0.02
    with pytest.raises(ValueError, match="lambda_scheme"):
        sample_lambda("beta", g)


@pytest.mark.numeric
@pytest.mark.parametrize("circuit", [False, True])
@pytest.mark.parametrize("build", [tiny_vit, tiny_gpt2])
def test_apply_dense_equals_apply_for_hard_elements(build, circuit):
    model = to_canonical(build(0))
    model = model.to_circuit() if circuit else model
    spec = SymmetrySpec.from_model(model)
    g = torch.Generator().manual_seed(0)
    t = Transform.sample(spec, {"residual": "orthogonal", "heads": "permutation", "mlp": "permutation"}, g)
    dense = {n: e.matrix if isinstance(e, Orthogonal) else e.dense() for n, e in t.items()}
    params = {k: v.double() for k, v in model.params().items()}
    got = apply_dense({n: m.double() for n, m in dense.items()}, spec, params)
    want = apply(t, model).params()
    assert_params_close_rel(got, want, FEW_OPS, "dense apply vs apply")
    with pytest.raises(ValueError if not circuit else KeyError, match="qk.0"):  # per-head; absorbed
        apply_dense({"qk.0": torch.eye(2)}, spec, params)


@pytest.mark.numeric
@pytest.mark.parametrize("build", [tiny_vit, tiny_gpt2])
def test_stacked_heads_interpolate_circuits(build):
    hf = build(0)
    a, b = to_canonical(hf), to_canonical(build(1))
    x = torch.randn(3, 1, 8, 8) if build is tiny_vit else torch.randint(0, 97, (3, 11))
    ca, cb = circuit_params(a.params()), circuit_params(b.params())
    circuit_config = a.to_circuit().config
    for lam in (0.0, 0.35, 1.0):
        stacked = canonical_forward(a.config, merge_params([a.params(), b.params()], [lam, 1 - lam], ("qk", "vo")), x)
        merged = canonical_forward(circuit_config, {k: lam * ca[k] + (1 - lam) * cb[k] for k in ca}, x)
        assert_close_rel(stacked, merged, FORWARD, f"stacked heads vs circuits at lambda {lam}")


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # a step outside a Trainer logs nothing
def test_lambda_candidates_train_at_the_draw_furthest_above_the_endpoints_line(pair):
    a, b = pair
    spec = SymmetrySpec.from_model(b)
    spaces = [s for s in spec if s.kind in ("residual", "heads", "mlp")]
    kinds = {s.name: "orthogonal" if s.kind == "residual" else "permutation" for s in spaces}
    init = {s.name: torch.eye(s.size) for s in spaces}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)

    def build(k):
        return LearnedMatchingModule(a, b, init, kinds, LearnedSettings(max_steps=3, lambda_candidates=k), b.task)

    module = build(5)

    def excess(lam):
        with torch.no_grad():
            ends = [float(module.loss(x, y, end)) for end in (1.0, 0.0)]  # A at lambda 1, T(B) = B at 0
            return float(module.loss(x, y, lam)) - lam * ends[0] - (1 - lam) * ends[1]

    assert abs(excess(0.0)) < 1e-5 and abs(excess(1.0)) < 1e-5  # the ends lie on their own line
    for candidates in ([0.1, 0.45, 0.8], [0.8, 0.45, 0.1], [0.3, 0.6]):
        scores = [excess(lam) for lam in candidates]
        assert len({round(v, 4) for v in scores}) == len(scores)  # distinct: the choice is a real one
        assert module.worst_lambda(x, y, candidates) == candidates[scores.index(max(scores))]
    # a step trains at the worst of its own draws; one candidate keeps the scheme's sequence unchanged
    for k in (1, 5):
        generator = torch.Generator().manual_seed(0)  # step 0 of latent seed 0
        draws = [sample_lambda("gaussian", generator) for _ in range(k)]
        module = build(k)
        module.training_step((x, y), 0)
        expected = draws[0] if k == 1 else module.worst_lambda(x, y, draws)
        assert float(module.history[0, 1]) == pytest.approx(expected)
    # drawn_loss keeps the chosen candidate's graph: the loss and gradients of that lambda afresh
    module = build(3)
    loss, lam = module.drawn_loss(x, y, [0.1, 0.45, 0.8])
    assert lam == module.worst_lambda(x, y, [0.1, 0.45, 0.8])
    loss.backward()
    drawn = {k: z.grad.clone() for k, z in module.latents.items()}
    module.zero_grad()
    fresh = module.loss(x, y, lam)
    fresh.backward()
    assert float(loss) == float(fresh)
    assert all(torch.equal(drawn[k], z.grad) for k, z in module.latents.items())
    with pytest.raises(ValueError, match="lambda_candidates"):
        LearnedSettings(lambda_candidates=0)


def test_learned_matching_lowers_midpoint_loss_and_preserves_b(tmp_path, pair):
    cfg = config(tmp_path, "matcher.learned.max_steps=30")
    data = digits(cfg)
    loader = data.train_dataloader()
    weight = matcher(cfg, "weight").match(*pair, context(cfg, data, tmp_path / "weight"))
    learned = matcher(cfg, "learned").match(*pair, context(cfg, data, tmp_path / "learned"))
    before = evaluate_path(weight, None, loader, [0.5], progress=False)["loss"][0]
    after = evaluate_path(learned, None, loader, [0.5], progress=False)["loss"][0]
    d = learned.diagnostics
    print(
        f"\n  midpoint train loss: weight matching {before:.4f}, learned {after:.4f}; changed {d['changed_from_init']}"
    )
    assert after < before - 0.01
    assert d["steps"] == 30 and len(d["loss_history"]) == 30 and d["endpoint_deviation"] < 1e-4
    assert learned.circuits == ("qk", "vo") and learned.function_preserving
    # the returned model is the hard transform applied to B: B's function exactly
    b = pair[1]
    x = next(iter(loader))[0]
    assert_close_rel(apply(learned.transform, b)(x), b(x), FORWARD, "learned transform applied to B vs B")
    assert_close_rel(learned.model(x), b(x), FORWARD, "learned model vs B")
    assert {type(g) for g in learned.transform.values()} == {Orthogonal, Permutation}


def test_learned_perm_and_sinkhorn_report_their_endpoints(tmp_path, pair):
    cfg = config(tmp_path)
    data = digits(cfg)
    perm = matcher(cfg, "learned_perm").match(*pair, context(cfg, data, tmp_path / "perm"))
    assert all(isinstance(g, Permutation) for g in perm.transform.values())
    assert perm.diagnostics["endpoint_deviation"] < 1e-4
    soft = matcher(cfg, "learned_sinkhorn").match(*pair, context(cfg, data, tmp_path / "soft"))
    assert isinstance(soft.transform["residual"], Orthogonal) and isinstance(soft.transform["mlp.0"], Permutation)
    assert not soft.function_preserving
    assert soft.diagnostics["endpoint_deviation"] > 1e-4  # soft permutations break function equivalence, and say so
    hard = soft.variants["hard_projection"]
    assert hard.function_preserving and hard.diagnostics == {}
    x = next(iter(data.train_dataloader()))[0]
    assert_close_rel(hard.model(x), pair[1](x), FORWARD, "hard projection vs B")


class Crash(Exception):
    pass


def crashing(make_trainer, at_step: int):
    """A Trainer factory whose Trainers carry a callback that kills the fit after `at_step` steps."""
    from lightning.pytorch.callbacks import Callback

    class CrashAt(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == at_step:
                raise Crash(f"killed at step {at_step}")

    def make(callbacks=(), **kwargs):
        return make_trainer(callbacks=[*callbacks, CrashAt()], **kwargs)

    return make


def test_interrupted_run_resumes_from_last_checkpoint(tmp_path, pair):
    # one batch per epoch, so the data seen at a step does not depend on where the run restarted
    cfg = config(tmp_path, "data.limit_train=64")
    data = digits(cfg)
    straight = matcher(cfg, "learned").match(*pair, context(cfg, data, tmp_path / "straight"))

    learned = matcher(cfg, "learned")
    normal = trainer_factory(cfg.trainer)
    with pytest.raises(Crash):
        learned.match(*pair, context(cfg, data, tmp_path / "resumed", crashing(normal, at_step=7)))
    last = next((tmp_path / "resumed").glob("pair_*/checkpoints/last.ckpt"))
    assert torch.load(last, weights_only=False)["global_step"] == 7
    resumed = learned.match(*pair, context(cfg, data, tmp_path / "resumed", normal))

    # an epoch ends after every step here: the epoch checkpoint (with the loader state) is preferred
    assert resumed.diagnostics["resumed_from"] in (str(last), str(last.with_name("epoch.ckpt")))
    assert torch.load(last, weights_only=False)["global_step"] == 12
    assert resumed.diagnostics["steps"] == 12
    assert resumed.diagnostics["lambda_history"] == straight.diagnostics["lambda_history"]
    assert resumed.diagnostics["loss_history"] == pytest.approx(straight.diagnostics["loss_history"], rel=1e-4)
    for name, g in straight.transform.items():
        h = resumed.transform[name]
        if isinstance(g, Permutation):
            assert torch.equal(g.perm, h.perm), name
        else:
            assert_close_rel(h.matrix, g.matrix, FORWARD, f"resumed vs straight {name}")


def test_other_settings_or_endpoints_never_resume_a_stale_checkpoint(tmp_path, pair):
    cfg = config(tmp_path, "data.limit_train=64", "matcher.learned.max_steps=4")
    data = digits(cfg)
    run_dir = tmp_path / "shared"
    first = matcher(cfg, "learned").match(*pair, context(cfg, data, run_dir))
    assert first.diagnostics["resumed_from"] is None
    again = matcher(cfg, "learned").match(*pair, context(cfg, data, run_dir))
    assert again.diagnostics["resumed_from"] == first.diagnostics["checkpoint"]
    other_lr = matcher(
        config(tmp_path, "data.limit_train=64", "matcher.learned.max_steps=4", "matcher.learned.lr=0.02"), "learned"
    )
    assert other_lr.match(*pair, context(cfg, data, run_dir)).diagnostics["resumed_from"] is None
    swapped = matcher(cfg, "learned").match(pair[1], pair[0], context(cfg, data, run_dir))
    assert swapped.diagnostics["resumed_from"] is None
    assert len(list(run_dir.glob("pair_*"))) == 3


@pytest.mark.slow
def test_ddp_with_two_cpu_processes(tmp_path, pair, monkeypatch):
    # ddp_fork: the launcher of ddp_cpu's ddp_spawn with forked ranks, which keep this process's imports
    # (a spawned rank spends seconds importing); what spawn would send to its ranks must still pickle
    from glmc.train import latent_fit

    real = latent_fit._fit

    def fit_sending_pickles(trainer, module, data, resume):
        pickle.loads(pickle.dumps((module, data)))
        real(trainer, module, data, resume)

    monkeypatch.setattr(latent_fit, "_fit", fit_sending_pickles)
    cfg = config(tmp_path, "trainer=ddp_cpu", "trainer.strategy=ddp_fork", "trainer.enable_progress_bar=false")
    data = digits(cfg)
    learned = matcher(cfg, "learned")
    assert isinstance(learned, LearnedMatcher)
    result = learned.match(*pair, context(cfg, data, tmp_path / "ddp"))
    assert result.diagnostics["world_size"] == 2
    assert result.diagnostics["steps"] == 12  # the trained state came back from the spawned ranks
    assert result.diagnostics["endpoint_deviation"] < 1e-4
    b = pair[1]
    x = next(iter(data.test_dataloader()))[0]
    assert_close_rel(apply(result.transform, b)(x), b(x), FORWARD, "DDP-learned transform applied to B vs B")


@pytest.mark.gpu
@pytest.mark.parametrize("units", ["permutation", "sinkhorn"])
def test_learned_step_on_cuda_matches_cpu(pair, units):
    """The step's loss and latent gradients on CUDA equal the CPU's, and the hard projections stay on the
    latents' device (the solver's answer moved back, the row-maxima shortcut computed there)."""
    a, b = pair
    spec = SymmetrySpec.from_model(b)
    spaces = [s for s in spec if s.kind in ("residual", "heads", "mlp")]
    kinds = {s.name: "orthogonal" if s.kind == "residual" else units for s in spaces}
    init = {s.name: torch.eye(s.size) for s in spaces}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)
    results = {}
    for device in ("cpu", "cuda"):
        module = LearnedMatchingModule(a, b, init, kinds, LearnedSettings(max_steps=3, init_noise=0.3), b.task)
        module.to(device)
        loss = module.loss(x.to(device), y.to(device), 0.4)
        loss.backward()
        grads = {n: p.grad.cpu() for n, p in module.latents.named_parameters()}
        elements = module.elements()
        for name, kind in kinds.items():
            got = elements[name][1] if kind == "permutation" else elements[name]
            assert got.device.type == device, name
        results[device] = (float(loss.detach()), grads)
    assert results["cuda"][0] == pytest.approx(results["cpu"][0], rel=1e-4)
    for name, grad in results["cpu"][1].items():
        assert_close_rel(results["cuda"][1][name], grad, 1e-3, f"gradient of {name}")
