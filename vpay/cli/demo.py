"""``vpay-server demo``: the main job on the embedded default (see vpay/demo.py)."""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("--deadline-seconds", default=150.0, show_default=True, type=float,
              help="Stop waiting for the batch to settle after this long.")
def demo(deadline_seconds: float) -> None:
    """The main job on the embedded default: sandbox rail, worker, a batch of payments."""
    from ..demo import run
    sys.exit(run(deadline_seconds=deadline_seconds))
