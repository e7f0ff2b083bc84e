"""Write or save the W&B workspace of the barrier curves that `logger=wandb` runs log.

    .venv/bin/python experiments/wandb_workspace.py --entity E --project P [--group G] [--json FILE] [--save]

--json writes the workspace definition (a W&B view spec, see glmc.pipeline.workspace) to FILE
offline; --save uploads it as a new saved view of the project (network and `wandb login` needed)
and prints its address. With neither the definition goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from glmc.pipeline.workspace import build_workspace, workspace_json


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entity", required=True, help="W&B user or team that owns the project")
    parser.add_argument("--project", required=True, help="W&B project (logger.project, glmc by default)")
    parser.add_argument("--group", help="only the runs of this W&B group (logger.group: the experiment's name)")
    parser.add_argument("--name", help="the workspace's name (default: 'barrier curves[: GROUP]')")
    parser.add_argument("--json", type=Path, help="write the definition to this file")
    parser.add_argument("--save", action="store_true", help="save the workspace to W&B")
    args = parser.parse_args(argv)

    workspace = build_workspace(args.entity, args.project, group=args.group, name=args.name)
    text = json.dumps(workspace_json(workspace), indent=2) + "\n"
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.save:
        workspace.save()
        print(workspace.url)
    if not args.json and not args.save:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
