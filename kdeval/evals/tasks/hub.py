"""Optional Hugging Face hub access, attempted only when a task is asked to use it."""
from __future__ import annotations

import os
from pathlib import Path

from kdeval.evals.tasks.base import TaskUnavailableError


def hub_offline() -> bool:
    """True when the environment forbids hub access (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_file(repo_id: str, filename: str, what: str) -> Path:
    """Download (or reuse the cached copy of) one file of a hub dataset repository."""
    if hub_offline():
        raise TaskUnavailableError(f"{what}: hub access is disabled (HF_HUB_OFFLINE); cannot fetch {repo_id}/{filename}")
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset"))
    except Exception as e:  # noqa: BLE001 - every failure means: not available here
        raise TaskUnavailableError(f"{what}: could not fetch {repo_id}/{filename} from the Hugging Face hub ({type(e).__name__}: {e})") from None


def hub_rows(path: str, name: str | None, split: str, what: str) -> list[dict]:
    """All rows of a hub dataset split via ``datasets.load_dataset``."""
    if hub_offline():
        raise TaskUnavailableError(f"{what}: hub access is disabled (HF_HUB_OFFLINE); cannot load {path}")
    try:
        import datasets

        ds = datasets.load_dataset(path, name, split=split)
        return [dict(r) for r in ds]
    except Exception as e:  # noqa: BLE001
        raise TaskUnavailableError(f"{what}: could not load {path} ({name or 'default'}, {split}) with datasets ({type(e).__name__}: {e})") from None
