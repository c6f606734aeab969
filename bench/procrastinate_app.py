"""The peer queue for bench/peers.py: a procrastinate app with one no-op task.

Run by the bench as ``python -m procrastinate --app=procrastinate_app.app
worker ...`` with ``bench/`` on ``PYTHONPATH`` and the database in
``BENCH_PROCRASTINATE_URL``. procrastinate is the ``bench`` extra of
setup.py (``pip install -e '.[bench]'``), never a runtime dependency.
"""

import os

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_PROCRASTINATE_URL", "")),
)


@app.task(name="noop")
def noop() -> None:
    """Does nothing: the job's cost is the queue's alone (vpay's ``test.noop``)."""
