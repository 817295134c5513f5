"""The top-level `metrics` object of tables-config.json: where the Prometheus text file goes.

node_exporter's textfile collector reads a folder it was started with; the tool never creates
that folder (a typo would otherwise write metrics nobody reads), so a missing one is a config
error (exit 2) with the fix, found before a run touches anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from ..base.errors import ConfigError


def _a_path(value: str) -> str:
    if not value.strip():
        raise ValueError('expected a file path like "/var/lib/node_exporter/replicator.prom"')
    return value


class MetricsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # Relative paths are relative to the project folder.
    textfile: Annotated[str, AfterValidator(_a_path)] | None = None


def textfile_path(config: MetricsConfig | None, root: Path | None) -> Path | None:
    """The metrics file as an absolute path, its folder checked; None when not configured."""
    if config is None or config.textfile is None:
        return None
    path = Path(config.textfile).expanduser()
    if not path.is_absolute() and root is not None:
        path = root / path
    folder = path.parent
    if path.is_dir():
        raise ConfigError(
            [f"metrics.textfile: {path} is a folder: name a file in it ({path}/replicator.prom)"]
        )
    if not folder.is_dir():
        raise ConfigError(
            [
                f"metrics.textfile: the folder {folder} does not exist: create it "
                f"(mkdir -p {folder}) or set metrics.textfile to a file in node_exporter's "
                "--collector.textfile.directory"
            ]
        )
    return path
