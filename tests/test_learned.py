"""Learned matching: projections, lambda schemes, the dense apply, training, resume and DDP."""
from __future__ import annotations

import pytest
import torch
from conftest import compose_config
from tiny_hf import tiny_gpt2, tiny_vit

from glmc.data.module import DataModule
from glmc.eval.path import evaluate_path
from glmc.matching.interpolate import interpolate_params
from glmc.matching.learned import LearnedMatcher
from glmc.matching.learned_module import LAMBDA_SCHEMES, sample_lambda
from glmc.matching.projections import polar, sinkhorn, sinkhorn_latent, straight_through_permutation
from glmc.matching.registry import MatchContext, build_matcher
from glmc.models import canonical_forward, relative_deviation, to_canonical
from glmc.models.canonical import circuit_params
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply, apply_dense

TINY = dict(hidden=16, heads=2, mlp=32)


@pytest.fixture(scope="module")
def pair():
    return tiny_vit(0, **TINY), tiny_vit(1, **TINY)


def config(tmp_path, *overrides):
    return compose_config("debug=fast", "logger=none", f"cache_dir={tmp_path / 'endpoints'}",
                          "matcher.learned.max_steps=12", "matcher.learned.lr=0.01",
                          "matcher.learned.checkpoint_every=4", *overrides)


def digits(cfg):
    data = DataModule(cfg.data, seed=0)
    data.setup()
    return data


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
    ranges = {"fixed": (0.5, 0.5), "uniform_mid": (0.4, 0.6), "uniform": (0.0, 1.0), "gaussian": (0.0, 1.0)}
    assert set(ranges) == set(LAMBDA_SCHEMES)
    for scheme, (lo, hi) in ranges.items():
        lams = torch.tensor([sample_lambda(scheme, g) for _ in range(2000)])
        assert lo <= lams.min() and lams.max() <= hi, scheme
        assert abs(lams.mean() - 0.5) < 0.03, scheme
    assert torch.tensor([sample_lambda("uniform", g) for _ in range(2000)]).std() > 0.25
    with pytest.raises(ValueError, match="lambda_scheme"):
        sample_lambda("beta", g)


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
    for name, w in want.items():
        assert torch.allclose(got[name].float(), w, atol=1e-6), name
    with pytest.raises(ValueError if not circuit else KeyError, match="qk.0"):  # per-head; absorbed
        apply_dense({"qk.0": torch.eye(2)}, spec, params)


@pytest.mark.parametrize("build", [tiny_vit, tiny_gpt2])
def test_stacked_heads_interpolate_circuits(build):
    hf = build(0)
    a, b = to_canonical(hf), to_canonical(build(1))
    x = torch.randn(3, 1, 8, 8) if build is tiny_vit else torch.randint(0, 97, (3, 11))
    ca, cb = circuit_params(a.params()), circuit_params(b.params())
    circuit_config = a.to_circuit().config
    for lam in (0.0, 0.35, 1.0):
        stacked = canonical_forward(a.config, interpolate_params(a.params(), b.params(), lam, circuits=True), x)
        merged = canonical_forward(circuit_config, {k: lam * ca[k] + (1 - lam) * cb[k] for k in ca}, x)
        assert relative_deviation(stacked, merged) < 1e-5


def test_learned_matching_lowers_midpoint_loss_and_preserves_b(tmp_path, pair):
    cfg = config(tmp_path, "matcher.learned.max_steps=30")
    data = digits(cfg)
    loader = data.train_dataloader()
    weight = build_matcher("weight", cfg).match(*pair)
    learned = build_matcher("learned", cfg, MatchContext(tmp_path / "learned")).match(*pair, data=data)
    before = evaluate_path(weight.reference, weight.model, loader, [0.5], progress=False)["loss"][0]
    after = evaluate_path(learned.reference, learned.model, loader, [0.5], progress=False)["loss"][0]
    d = learned.diagnostics
    print(f"\n  midpoint train loss: weight matching {before:.4f}, learned {after:.4f}; changed {d['changed_from_init']}")
    assert after < before - 0.01
    assert d["steps"] == 30 and len(d["loss_history"]) == 30 and d["endpoint_deviation"] < 1e-4
    # the returned model is the hard transform applied to B: B's function exactly
    b = to_canonical(pair[1])
    x = next(iter(loader))[0]
    assert relative_deviation(apply(learned.transform, b)(x), b(x)) < 1e-4
    assert relative_deviation(learned.model(x), b.to_circuit()(x)) < 1e-4
    assert {type(g) for g in learned.transform.values()} == {Orthogonal, Permutation}


def test_learned_perm_and_sinkhorn_report_their_endpoints(tmp_path, pair):
    cfg = config(tmp_path)
    data = digits(cfg)
    perm = build_matcher("learned_perm", cfg, MatchContext(tmp_path / "perm")).match(*pair, data=data)
    assert all(isinstance(g, Permutation) for g in perm.transform.values())
    assert perm.diagnostics["endpoint_deviation"] < 1e-4
    soft = build_matcher("learned_sinkhorn", cfg, MatchContext(tmp_path / "soft")).match(*pair, data=data)
    d = soft.diagnostics
    assert isinstance(soft.transform["residual"], Orthogonal) and isinstance(soft.transform["mlp.0"], Permutation)
    assert d["endpoint_deviation"] > 1e-4  # soft permutations break function equivalence, and say so
    assert d["hard_projection"]["endpoint_deviation"] < 1e-4 and "barrier" in d["hard_projection"]
    assert {"endpoint_test_loss", "model_b_test_loss"} <= set(d)


class Crash(Exception):
    pass


def crashing(make_trainer, at_step: int):
    """The run's Trainer factory with a callback that kills the fit after `at_step` steps."""
    from lightning.pytorch.callbacks import Callback

    class CrashAt(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == at_step:
                raise Crash(f"killed at step {at_step}")

    def make(run_dir, logger, callbacks=(), **kwargs):
        return make_trainer(run_dir, logger, callbacks=[*callbacks, CrashAt()], **kwargs)

    return make


def test_interrupted_run_resumes_from_last_checkpoint(tmp_path, pair):
    # one batch per epoch, so the data seen at a step does not depend on where the run restarted
    cfg = config(tmp_path, "data.limit_train=64")
    data = digits(cfg)
    straight = build_matcher("learned", cfg, MatchContext(tmp_path / "straight")).match(*pair, data=data)

    matcher = build_matcher("learned", cfg, MatchContext(tmp_path / "resumed"))
    normal = matcher.make_trainer
    matcher.make_trainer = crashing(normal, at_step=7)
    with pytest.raises(Crash):
        matcher.match(*pair, data=data)
    last = next((tmp_path / "resumed").glob("pair_*/checkpoints/last.ckpt"))
    assert torch.load(last, weights_only=False)["global_step"] == 7
    matcher.make_trainer = normal
    resumed = matcher.match(*pair, data=data)

    assert resumed.diagnostics["resumed_from"] == str(last)
    assert torch.load(last, weights_only=False)["global_step"] == 12
    assert resumed.diagnostics["steps"] == 12
    assert resumed.diagnostics["lambda_history"] == straight.diagnostics["lambda_history"]
    assert resumed.diagnostics["loss_history"] == pytest.approx(straight.diagnostics["loss_history"], rel=1e-4)
    for name, g in straight.transform.items():
        h = resumed.transform[name]
        assert torch.equal(g.perm, h.perm) if isinstance(g, Permutation) else torch.allclose(g.matrix, h.matrix, atol=1e-5)


def test_ddp_with_two_cpu_processes(tmp_path, pair):
    cfg = config(tmp_path, "trainer=ddp_cpu", "trainer.enable_progress_bar=false")
    data = digits(cfg)
    matcher = build_matcher("learned", cfg, MatchContext(tmp_path / "ddp"))
    assert isinstance(matcher, LearnedMatcher)
    result = matcher.match(*pair, data=data)
    assert result.diagnostics["world_size"] == 2
    assert result.diagnostics["steps"] == 12  # the trained state came back from the spawned ranks
    assert result.diagnostics["endpoint_deviation"] < 1e-4
    b = to_canonical(pair[1])
    x = next(iter(data.test_dataloader()))[0]
    assert relative_deviation(apply(result.transform, b)(x), b(x)) < 1e-4
