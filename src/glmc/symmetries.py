"""The symmetry audit of a model: `python -m glmc.symmetries FOLDER` for a save_pretrained folder, or
`glmc.symmetries(model)` for a Hugging Face or canonical model in memory (glmc.symmetry.audit says what it
checks). The command prints the audit and exits with status 1 where it finds a hole (a map that keeps the
model's function but that glmc's group leaves out) or a declared class that changes the function."""

from __future__ import annotations

import argparse
import sys
import types

from glmc.symmetry.audit import Audit, audit


def symmetries(model, seed: int = 0) -> Audit:
    """The audit of `model` (a Hugging Face model of a known family, or a canonical one)."""
    from glmc.api import to_canonical

    return audit(to_canonical(model), seed)


def audit_folder(path: str, seed: int = 0) -> Audit:
    """The audit of the model a save_pretrained folder holds (read as run.py reads endpoint folders)."""
    from glmc.pipeline.hf_folders import FolderError, canonical_of, load_model, read_folder

    try:  # a folder whose config names no class is read as a causal language model
        folder = read_folder(path, 0, task="causal_lm", name=path)
        model = canonical_of(folder, load_model(folder), keep_source=False)
    except FolderError as err:  # named by the folder, not by a run config's key
        raise FolderError(str(err).replace(f"endpoints.paths[0]={path}", path)) from None
    return audit(model, seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmc.symmetries", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a Hugging Face model folder (what save_pretrained writes)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the random elements and inputs")
    args = parser.parse_args(argv)
    from glmc.pipeline.hf_folders import FolderError

    try:
        result = audit_folder(args.folder, args.seed)
    except FolderError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(result)
    return 0 if result.ok else 1


class _CallableModule(types.ModuleType):
    """`glmc.symmetries(model)` calls the audit while `glmc.symmetries` stays this module (for -m)."""

    def __call__(self, model, seed: int = 0) -> Audit:
        return symmetries(model, seed)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
