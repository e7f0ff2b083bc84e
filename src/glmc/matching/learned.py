"""Learned matching (paper 001 §4.2): train the symmetry transformations on the task loss of the path.

  learned           orthogonal residual (polar factor) + head and MLP permutations (straight-through)
  learned_perm      every space permuted, the residual too (straight-through)
  learned_sinkhorn  orthogonal residual + soft head and MLP permutations (Sinkhorn, Appendix D)

The latents start at the weight-matching solution (init="weight") or the identity. Training runs
through the same Lightning Trainer settings as the endpoints, with checkpoints under
<run_dir>/pair_<fingerprint>/checkpoints: a run started again in the same folder resumes from
last.ckpt. The returned transform is the hard projection of the latents, so the aligned model B
computes B's function; the Sinkhorn matcher returns the soft-aligned B instead (the path it trained)
and reports how far that endpoint drifts from B.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any, Callable

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import Tensor

from glmc.config import LearnedMatchingConfig
from glmc.eval.barrier import barrier
from glmc.eval.metrics import loss_and_correct
from glmc.eval.path import evaluate_path
from glmc.matching.base import Alignment
from glmc.matching.learned_module import LearnedMatchingModule
from glmc.matching.weight import as_canonical, weight_matching
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply, apply_dense


def fingerprint(*models: torch.nn.Module) -> str:
    """Short hash of the models' parameters: names a pair's checkpoint folder."""
    h = hashlib.sha1()
    for model in models:
        for name, t in sorted(model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


class _SaveLast(Callback):
    """last.ckpt at the end of training too, not only every `checkpoint_every` steps."""

    def __init__(self, path: Path):
        self.path = str(path)

    def on_train_end(self, trainer, pl_module) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)  # every rank calls it; rank 0 writes


def _dense(g) -> Tensor:
    return g.matrix if isinstance(g, Orthogonal) else g.dense()


@torch.no_grad()
def _test_logits(model: CanonicalTransformer, loader, task: str) -> tuple[Tensor, float]:
    """All logits on the loader and the mean loss."""
    logits, total, count = [], 0.0, 0
    for inputs, targets in loader:
        out = model(inputs)
        loss, _, n = loss_and_correct(out, targets, task)
        logits.append(out)
        total, count = total + float(loss), count + n
    return torch.cat(logits), total / count


class LearnedMatcher:
    """`kinds` maps a space kind (residual, heads, mlp) to orthogonal | permutation | sinkhorn | none."""

    def __init__(self, name: str, kinds: dict[str, str], settings: LearnedMatchingConfig, task: str,
                 circuits: bool, make_trainer: Callable[..., Any], run_dir: Path, logger_for=None,
                 weight_iters: int = 15, weight_tol: float = 1e-6, lambdas: list[float] | None = None):
        if settings.init not in ("weight", "identity"):
            raise ValueError(f"matcher.learned.init={settings.init!r} is not one of weight, identity")
        self.name, self.kinds, self.settings, self.task, self.circuits = name, kinds, settings, task, circuits
        self.make_trainer, self.run_dir, self.logger_for = make_trainer, Path(run_dir), logger_for
        self.weight_iters, self.weight_tol = weight_iters, weight_tol
        self.lambdas = lambdas or [i / 10 for i in range(11)]

    def initial_transform(self, a: CanonicalTransformer, b: CanonicalTransformer, spec: SymmetrySpec):
        spaces = [s for s in spec if self.kinds.get(s.kind, "none") != "none"]
        if self.settings.init == "identity":
            return Transform({s.name: Permutation.identity(s.size) for s in spaces}), {}
        residual = {"orthogonal": "orthogonal", "permutation": "permutation", "sinkhorn": "permutation"}
        transform, diagnostics = weight_matching(
            a, b, residual=residual.get(self.kinds.get("residual", "none"), "none"),
            heads=self.kinds.get("heads", "none") != "none", mlp=self.kinds.get("mlp", "none") != "none",
            max_iter=self.weight_iters, tol=self.weight_tol)
        return transform, {"iterations": diagnostics["iterations"], "final_distance": diagnostics["final_distance"]}

    def match(self, model_a, model_b, data=None) -> Alignment:
        if data is None:
            raise ValueError(f"{self.name} trains on the task loss: it needs the DataModule")
        a, b = as_canonical(model_a), as_canonical(model_b)
        spec = SymmetrySpec.from_model(b)
        kinds = {s.name: self.kinds[s.kind] for s in spec if self.kinds.get(s.kind, "none") != "none"}

        tick = time.perf_counter()
        start, wm = self.initial_transform(a, b, spec)
        seconds_init = time.perf_counter() - tick
        module = LearnedMatchingModule(a, b, {n: _dense(g) for n, g in start.items()}, kinds, self.settings,
                                       self.task, self.circuits)

        pair_dir = self.run_dir / f"pair_{fingerprint(a, b)}"
        last = pair_dir / "checkpoints" / "last.ckpt"
        resume = last if last.exists() else None
        checkpoints = ModelCheckpoint(dirpath=pair_dir / "checkpoints", save_last=True, save_top_k=0,
                                      every_n_train_steps=self.settings.checkpoint_every, save_on_exception=True,
                                      enable_version_counter=False)
        logger = self.logger_for(f"{self.name}/{pair_dir.name}") if self.logger_for else False
        trainer = self.make_trainer(pair_dir, logger, max_steps=self.settings.max_steps, max_epochs=-1,
                                    callbacks=[checkpoints, _SaveLast(last)], num_sanity_val_steps=0,
                                    limit_val_batches=0)
        tick = time.perf_counter()
        trainer.fit(module, datamodule=data, ckpt_path=resume)
        seconds_train = time.perf_counter() - tick
        module = module.cpu()

        hard = module.hard_transform()
        aligned = apply(hard, b)
        test_loader = data.test_dataloader()
        logits_b, loss_b = _test_logits(b, test_loader, self.task)
        logits_hard, _ = _test_logits(aligned, test_loader, self.task)
        history = module.history[~module.history[:, 0].isnan()]
        diagnostics: dict[str, Any] = {
            "init": self.settings.init,
            "weight_matching": wm,
            "steps": len(history),
            "world_size": trainer.world_size,
            "resumed_from": str(resume) if resume else None,
            "checkpoint": str(last),
            "loss_history": [float(x) for x in history[:, 0]],
            "lambda_history": [float(x) for x in history[:, 1]],
            "changed_from_init": _changes(start, hard),
            "endpoint_deviation": relative_deviation(logits_hard, logits_b),
            "seconds_init": seconds_init,
            "seconds_train": seconds_train,
        }

        reference, model = a, aligned
        if "sinkhorn" in kinds.values():
            with torch.no_grad():
                soft = {n: m.double() for n, m in module.matrices().items()}
                params = apply_dense(soft, spec, {k: v.double() for k, v in b.params().items()})
            soft_b = CanonicalTransformer(dataclasses.replace(b.config), {k: v.float() for k, v in params.items()})
            logits_soft, loss_soft = _test_logits(soft_b, test_loader, self.task)
            diagnostics.update({
                "endpoint_deviation": relative_deviation(logits_soft, logits_b),
                "endpoint_test_loss": loss_soft,
                "model_b_test_loss": loss_b,
                "hard_projection": self._hard_path(a, aligned, test_loader, relative_deviation(logits_hard, logits_b)),
            })
            model = soft_b
        if self.circuits:  # the path the module trained on: attention interpolated as circuits
            reference, model = reference.to_circuit(), model.to_circuit()
        return Alignment(reference=reference, model=model, transform=hard, diagnostics=diagnostics)

    def _hard_path(self, a, aligned, loader, deviation: float) -> dict[str, Any]:
        """The barrier had the Sinkhorn latents been rounded to permutations."""
        ref, model = (a.to_circuit(), aligned.to_circuit()) if self.circuits else (a, aligned)
        curve = evaluate_path(ref, model, loader, self.lambdas, self.task, progress=False)
        return {"barrier": barrier(self.lambdas, curve["loss"]), "test_loss": curve["loss"],
                "endpoint_deviation": deviation}


def _changes(start: Transform, final: Transform) -> dict[str, float]:
    """Per space: share of units assigned differently (permutations), or ||O - O_0|| / sqrt(n)."""
    out = {}
    for name, g in final.items():
        g0 = start[name]
        if isinstance(g, Permutation):
            p0 = g0.perm if isinstance(g0, Permutation) else Permutation.project(_dense(g0)).perm
            out[name] = float((g.perm.cpu() != p0.cpu()).float().mean())
        else:
            d = (g.matrix.double() - _dense(g0).double().to(g.matrix.device)).norm() / g.matrix.shape[1] ** 0.5
            out[name] = float(d)
    return out
