"""Barrier curves as a picture: loss and accuracy (language models: perplexity) against lambda,
one curve per method."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt


def _is_lm(m: dict[str, Any]) -> bool:
    return all(a is None for a in m["test_accuracy"])


def _second(m: dict[str, Any]) -> list:
    """The right panel's curve: perplexity for language models (no accuracy), accuracy otherwise."""
    return [math.exp(x) for x in m["test_loss"]] if _is_lm(m) else m["test_accuracy"]


def plot_barrier_curves(methods: dict[str, dict[str, Any]], path: Path, title: str = "") -> Path:
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for name, m in methods.items():
        lam = m["lambdas"]
        label = f"{name} (barrier {m['barrier']:.3f})"
        (line,) = ax_loss.plot(lam, m["test_loss"], marker=".", label=label)
        ax_acc.plot(lam, _second(m), marker=".", color=line.get_color(), label=name)
    # The endpoints are the trained models themselves: mark them once, from the first method.
    first = next(iter(methods.values()))
    lam, loss, acc = first["lambdas"], first["test_loss"], _second(first)
    for ax, ys in ((ax_loss, loss), (ax_acc, acc)):
        if ys[0] is None:
            continue
        ax.scatter([lam[0], lam[-1]], [ys[0], ys[-1]], s=80, color="black", zorder=5, label="endpoints")
        ax.annotate("B", (lam[0], ys[0]), textcoords="offset points", xytext=(6, 6))
        ax.annotate("A", (lam[-1], ys[-1]), textcoords="offset points", xytext=(-12, 6))
        ax.set_xlabel("λ   (θ = λ·θ_A + (1−λ)·θ_B)")
        ax.grid(alpha=0.3)
    ax_loss.set_ylabel("test loss (nats)")
    ax_acc.set_ylabel("test perplexity" if _is_lm(first) else "test accuracy")
    ax_loss.legend(fontsize=8)
    ax_acc.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    # fixed margins: tight_layout would draw the figure once more only to measure it (most of a run's plot time)
    fig.subplots_adjust(left=0.07, right=0.985, bottom=0.12, top=0.88 if title else 0.95, wspace=0.22)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
