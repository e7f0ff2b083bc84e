"""Cost of one learned-matching step relative to one plain training step of an endpoint.

Same model configuration, the same sequence of training batches, measured in the same run: the plain step is forward,
backward, gradient clipping and AdamW on the Hugging Face endpoint; the learned step projects the
latents, transforms model B, interpolates with A and runs forward, backward and AdamW on the latents, at
lambda drawn as training draws it (with `lambda_candidates` > 1, the draws' losses are evaluated first).
The plain step trains on the endpoint's own loss (glmc.train.endpoint.training_loss: the next token's
cross-entropy for a causal LM, at any sequence length). Prints the medians over repeats, their ratio (the
target is at most 1.5x), tokens (or images) per second of each, the floor of a learned step (the plain
step plus the products the merged parameters add, forward and backward, counted by
torch.utils.flop_counter and priced at the plain step's rate, and the projections) and how far the step is
from it, and
the same learned step on the earlier path (`dense_apply`: every latent applied as a dense
straight-through matrix) beside it.

  .venv/bin/python benchmarks/learned_step_cost.py [--device cuda] [--repeats 7]
      [hydra overrides, e.g. matcher.learned.lr=1e-2]

--device runs both steps on that device (default cpu); the times then wait for its queued kernels.
--compile runs both steps' forward and loss through torch.compile (the learned step's hard projections,
SciPy's solver, stay outside the graph); compiling happens in the warm-up and is reported on its own.
--profile N prints torch.profiler's operator table of each step over N more steps (by self time on the card,
or the CPU): where a learned step's time goes beyond its products.
--advance N takes N learned steps before timing: later in a run the latents are further from
permutations and the solver costs more. The step that solves every hard projection afresh
(`keep_assignments=False`, the previous path) is timed beside the one that keeps a certified answer.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch.utils.flop_counter import FlopCounterMode

from glmc.config import register_configs
from glmc.data.module import DataModule
from glmc.matching.learned_module import LearnedMatchingModule, sample_lambda
from glmc.matching.registry import build_matcher, method_config
from glmc.matching.weight import weight_matching
from glmc.metrics import logits_of, loss_and_correct
from glmc.models.build import build_model
from glmc.models.canonical import canonical_forward, circuit_params
from glmc.models.convert import to_canonical
from glmc.pipeline.cache import EndpointCache
from glmc.pipeline.endpoints import cache_key
from glmc.symmetry import Orthogonal, SymmetrySpec
from glmc.train.endpoint import training_loss

ROOT = Path(__file__).resolve().parents[1]


def endpoints(cfg):
    """Cached endpoints of the first two seeds when there are any, else fresh initialisations."""
    cache, key, models = EndpointCache(ROOT / cfg.cache_dir), cache_key(cfg), []
    for seed in list(cfg.seeds)[:2]:
        torch.manual_seed(seed)
        model = build_model(cfg.model)
        if cache.has(key, seed):
            cache.load(key, seed, model)
        models.append(model.eval())
    return models, all(cache.has(key, s) for s in list(cfg.seeds)[:2])


def timed(step, n: int, device: torch.device) -> float:
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    synchronize()
    start = time.perf_counter()
    for _ in range(n):
        step()
    synchronize()
    return (time.perf_counter() - start) / n


def main(
    overrides: list[str],
    repeats: int = 7,
    steps: int = 10,
    device: str = "cpu",
    compile: bool = False,
    advance: int = 0,
    profile: int = 0,
) -> None:
    device = torch.device(device)
    maybe_compiled = torch.compile if compile else lambda f: f
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    (model_a, model_b), cached = endpoints(cfg)
    data = DataModule(cfg.data, seed=0)
    data.setup()
    # the training split's batches in order, cycled: every step sees the next one, as in training (on one
    # repeated batch the latents drift further from permutations and the projections cost more than they do)
    batches = [tuple(t.to(device) for t in b) for _, b in zip(range(64), data.train_dataloader())]
    order = itertools.cycle(batches)
    inputs, targets = batches[0]

    plain = build_model(cfg.model)
    plain.load_state_dict(model_a.state_dict())
    plain.to(device).train()
    plain_logits = maybe_compiled(logits_of)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)

    def plain_step():
        plain_opt.zero_grad(set_to_none=True)
        inputs, targets = next(order)
        loss = training_loss(plain_logits(plain, inputs), targets, cfg.data.task, cfg.train.label_smoothing)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), cfg.train.gradient_clip_val)
        plain_opt.step()

    a, b = to_canonical(model_a), to_canonical(model_b)
    transform, _ = weight_matching(a, b)
    spec = SymmetrySpec.from_model(b)
    kinds = {
        s.name: "orthogonal" if s.kind == "residual" else "permutation"
        for s in spec
        if s.kind in ("residual", "heads", "mlp")
    }
    init = {n: g.matrix if isinstance(g, Orthogonal) else g.dense() for n, g in transform.items()}
    matcher = build_matcher(method_config(cfg, "learned"))
    settings = matcher.settings
    module = LearnedMatchingModule(a, b, init, kinds, settings, cfg.data.task, matcher.circuits).to(device)
    learned_loss = maybe_compiled(module.drawn_loss)
    learned_opt = torch.optim.AdamW(module.latents.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)

    draws = torch.Generator().manual_seed(0)

    def learned_step():  # as LearnedMatchingModule.training_step: the worst of the settings' lambda draws
        learned_opt.zero_grad(set_to_none=True)
        candidates = [sample_lambda(settings.lambda_scheme, draws) for _ in range(settings.lambda_candidates)]
        learned_loss(*next(order), candidates)[0].backward()
        learned_opt.step()

    def earlier_step():  # the previous path: dense products with every straight-through matrix
        module.dense_apply = True
        learned_step()
        module.dense_apply = False

    circuit_config = a.to_circuit().config
    circuits_a = circuit_params(module.endpoint_params("a"))

    def circuit_step():
        learned_opt.zero_grad(set_to_none=True)
        cb = circuit_params(module.aligned_params())
        merged = {k: 0.5 * v + 0.5 * cb[k] for k, v in circuits_a.items()}
        inputs, targets = next(order)
        total, _, count = loss_and_correct(canonical_forward(circuit_config, merged, inputs), targets, cfg.data.task)
        (total / count).backward()
        learned_opt.step()

    def solver_step():  # the hard projections solved afresh every step (the previous path)
        module.keep_assignments = False
        learned_step()
        module.keep_assignments = True

    def projections():  # what the solver costs at this point of the run (the kept answers put aside)
        module.keep_assignments = False
        with torch.no_grad():
            module.elements()
        module.keep_assignments = True

    for _ in range(advance):  # later in a run the latents are further from permutations
        learned_step()

    print(
        f"model {cfg.model.name} ({'cached endpoints' if cached else 'untrained initialisations'}), "
        f"batch {tuple(inputs.shape)}, {where(device)}{', compiled' if compile else ''}, "
        f"median of {repeats} repeats x {steps} steps after {advance} learned steps",
        flush=True,
    )
    warmup = {
        step.__name__: 3 * timed(step, 3, device)
        for step in (plain_step, learned_step, solver_step, earlier_step, circuit_step)
    }
    times = {"plain": [], "learned": [], "solver": [], "earlier": [], "projections": [], "circuit": []}
    for _ in range(repeats):  # interleaved, so drifts in machine load hit both alike
        times["plain"].append(timed(plain_step, steps, device))
        times["learned"].append(timed(learned_step, steps, device))
        times["solver"].append(timed(solver_step, steps, device))
        times["earlier"].append(timed(earlier_step, steps, device))
        times["projections"].append(timed(projections, steps, device))
        times["circuit"].append(timed(circuit_step, steps, device))
    med = {k: statistics.median(v) for k, v in times.items()}
    plain_flops, learned_flops = (step_flops(step) for step in (plain_step, learned_step))

    if compile:
        print(
            f"  torch.compile: the 3 warm-up steps took {warmup['plain_step']:.1f} s plain, "
            f"{warmup['learned_step']:.1f} s learned"
        )
    print(f"  plain training step (HF endpoint)        {1e3 * med['plain']:8.2f} ms")
    print(f"  learned matching step ({settings.lambda_candidates} lambda draws)    {1e3 * med['learned']:8.2f} ms")
    print(f"    projections with the solver every step  {1e3 * med['projections']:6.2f} ms")
    print(f"  ratio learned / plain                    {med['learned'] / med['plain']:8.2f}x  (target <= 1.5x)")
    unit, per_step = throughput_unit(inputs, cfg.data.task)
    print(
        f"  {unit} per second: plain {per_step / med['plain']:,.0f}, learned {per_step / med['learned']:,.0f}"
        f" ({per_step} {unit} a step)"
    )
    print_floor(med, plain_flops, learned_flops)
    print(
        f"  the solver every step (no kept answers)  {1e3 * med['solver']:8.2f} ms"
        f"  (keeping certified answers saves {1e3 * (med['solver'] - med['learned']):.2f} ms a step)"
    )
    print(
        f"  earlier path (dense straight-through)    {1e3 * med['earlier']:8.2f} ms"
        f"  ({med['earlier'] / med['plain']:.2f}x plain; the new step is {med['earlier'] / med['learned']:.2f}x faster)"
    )
    print(
        f"  learned step through explicit circuits   {1e3 * med['circuit']:8.2f} ms"
        f"  ({med['circuit'] / med['plain']:.2f}x plain)"
    )
    if profile:
        print_profile({"plain": plain_step, "learned": learned_step}, profile, device)


def print_profile(steps: dict, n: int, device: torch.device, rows: int = 20) -> None:
    """torch.profiler's table of each step over `n` runs: the operators by their own time on the device
    (the CPU's where there is no card), with their call counts, where the step's time goes beyond the
    products (small kernels, copies, launches)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name, step in steps.items():
        with profile(activities=activities) as prof:
            timed(step, n, device)
        print(f"\n  profile of the {name} step, {n} steps, by {key}:")
        print(prof.key_averages().table(sort_by=key, row_limit=rows))


def step_flops(step) -> float:
    """The matrix products' floating-point operations of one step, forward and backward
    (torch.utils.flop_counter)."""
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def print_floor(med: dict[str, float], plain_flops: float, learned_flops: float) -> None:
    """The floor of a learned step: the plain step, plus the products it adds (merging the parameters:
    B transformed, the heads as circuits, and their backward) at the plain step's own rate, plus the
    projections; and how far the step is from it."""
    rate = plain_flops / med["plain"]
    extra = max(learned_flops - plain_flops, 0.0)
    floor = med["plain"] + extra / rate
    print(
        f"  products per step: plain {plain_flops / 1e9:.3f} GFLOP, learned {learned_flops / 1e9:.3f} GFLOP "
        f"({learned_flops / plain_flops:.2f}x: the merged parameters' extra forward and backward)"
    )
    print(
        f"  floor: plain + the extra products at the plain step's rate ({rate / 1e9:.1f} GFLOP/s) "
        f"{1e3 * floor:.2f} ms ({floor / med['plain']:.2f}x plain), "
        f"+ projections {1e3 * (floor + med['projections']):.2f} ms; "
        f"the learned step is {med['learned'] / floor:.2f}x the floor, "
        f"{med['learned'] / (floor + med['projections']):.2f}x with the projections"
    )


def throughput_unit(inputs: torch.Tensor, task: str) -> tuple[str, int]:
    """What a step processes: tokens for the language tasks, examples (images) for classification."""
    if task in ("causal_lm", "masked_lm"):
        return "tokens", inputs.numel()
    return "examples", inputs.shape[0]


def where(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU, {torch.get_num_threads()} threads"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="where both steps run, e.g. cuda")
    parser.add_argument("--compile", action="store_true", help="both steps' forward and loss through torch.compile")
    parser.add_argument("--advance", type=int, default=0, help="learned steps before timing")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats of every step's timing")
    parser.add_argument("--profile", type=int, default=0, help="then torch.profiler's table over this many steps")
    known, overrides = parser.parse_known_args()
    main(overrides, known.repeats, 10, known.device, known.compile, known.advance, known.profile)
