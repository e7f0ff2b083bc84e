"""Whether W&B can log online here, told before any work: wandb.init(mode="online") without an API key fails
only when the first W&B run starts, after the endpoints trained. Read locally, where W&B reads its key
(WANDB_API_KEY or an identity token file, else the netrc file's entry for its host); nothing is sent."""

from __future__ import annotations

import configparser
import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from omegaconf import OmegaConf

DEFAULT_HOST = "https://api.wandb.ai"


def wandb_host() -> str:
    """The W&B server: WANDB_BASE_URL, else the base_url `wandb login --host` saved in W&B's settings file."""
    url = os.environ.get("WANDB_BASE_URL")
    if not url:
        folder = Path(os.environ.get("WANDB_CONFIG_DIR") or "~/.config/wandb").expanduser()
        settings = configparser.ConfigParser()
        try:
            settings.read(folder / "settings")
            url = settings.get("default", "base_url", fallback=None)
        except (OSError, configparser.Error):
            url = None
    return url or DEFAULT_HOST


def netrc_path() -> Path:
    """The netrc file W&B reads: NETRC, else ~/.netrc (~/_netrc where only that one exists)."""
    if os.environ.get("NETRC"):
        return Path(os.environ["NETRC"]).expanduser()
    home = Path("~/.netrc").expanduser()
    other = Path("~/_netrc").expanduser()
    return other if not home.exists() and other.exists() else home


def has_wandb_key(host: str) -> bool:
    """A key for `host` in the environment or the netrc file."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:
        entry = netrc.netrc(str(netrc_path())).authenticators(urlsplit(host).netloc)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def wandb_login_problems(cfg: Any) -> list[str]:
    """logger=wandb logger.mode=online where W&B finds no API key: what to do instead."""
    if str(OmegaConf.select(cfg, "logger.kind")) != "wandb" or str(OmegaConf.select(cfg, "logger.mode")) != "online":
        return []
    host = wandb_host()
    if has_wandb_key(host):
        return []
    return [
        f"logger.mode=online: W&B has no API key for {host} here (WANDB_API_KEY is not set and {netrc_path()} "
        "holds none), so the run would fail when its first W&B run starts; run `wandb login` (or set "
        "WANDB_API_KEY) first, or use logger.mode=offline and `wandb sync` the run folder's wandb/ later"
    ]
