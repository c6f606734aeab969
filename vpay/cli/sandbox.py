"""``vpay-server sandbox-rail``: the MoMo-shaped sandbox rail on its own (demos, local development).
Its full behaviour is in docs/sandbox.md."""

from __future__ import annotations

import json
import logging
import os

import click

from vpay.cli.common import PORT, Duration
from vpay.cli.errors import Unavailable

log = logging.getLogger("vpay.cli")


@click.command("sandbox-rail")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8090, show_default=True, type=PORT, help="TCP port (0..65535; 0: any free one).")
@click.option("--success-after-seconds", default="3s", show_default=True, type=Duration(bare="s"),
              help="Payers outside MTN's failure numbers succeed this long after the request-to-pay "
                   "(seconds, or 3s, 1m).")
@click.option("--reason-shape", type=click.Choice(["string", "object"]), default="string", show_default=True,
              help="A FAILED status's reason: a plain string (MTN's published shape) or {code, message}.")
@click.option("--target-environment", envvar="VPAY_MTN_TARGET_ENVIRONMENT", default="sandbox",
              show_default=True,
              help="The X-Target-Environment it answers to (env VPAY_MTN_TARGET_ENVIRONMENT). "
                   "'sandbox' takes EUR only, as MTN's sandbox does; any other name takes any currency.")
def sandbox_rail(host: str, port: int, success_after_seconds: float, reason_shape: str,
                 target_environment: str) -> None:
    """A local HTTP server speaking the MTN MoMo Collection and Disbursement APIs (demos and tests).

    Credentials it accepts are those of VPAY_MTN_SUBSCRIPTION_KEY, VPAY_MTN_API_USER,
    VPAY_MTN_API_KEY (defaults: the sandbox's own MTN-shaped ones, see docs/sandbox.md).
    A port that is busy (or an address not on this host) exits 69 with one line."""
    import signal as _signal
    from vpay.sandbox.mtn import SandboxRail
    kwargs = {k: v for k, v in {
        "subscription_key": os.environ.get("VPAY_MTN_SUBSCRIPTION_KEY"),
        "api_user": os.environ.get("VPAY_MTN_API_USER"),
        "api_key": os.environ.get("VPAY_MTN_API_KEY"),
    }.items() if v}
    try:
        rail = SandboxRail(host, port, success_after_seconds=success_after_seconds,
                           reason_shape=reason_shape, target_environment=target_environment, **kwargs)
    except OSError as exc:  # a busy port, an address not on this host
        raise Unavailable(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None

    def _stop(signum, frame):
        raise KeyboardInterrupt

    _signal.signal(_signal.SIGTERM, _stop)
    log.info("sandbox rail listening", extra={"url": rail.url})
    click.echo(json.dumps({"url": rail.url}), err=True)
    try:
        rail.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        rail.stop()
