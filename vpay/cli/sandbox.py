"""``vpay-server sandbox-rail``: a sandbox rail on its own (demos, local development): MoMo by
default, M-Pesa Daraja (``--rail mpesa``) or pawaPay (``--rail pawapay``). Its full behaviour is
in docs/sandbox.md."""

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
@click.option("--rail", "code", type=click.Choice(["mtn", "mpesa", "pawapay"]), default="mtn", show_default=True,
              help="Which rail to speak: MTN MoMo, M-Pesa Daraja (STK Push) or pawaPay (v2 deposits, refunds).")
def sandbox_rail(host: str, port: int, success_after_seconds: float, reason_shape: str,
                 target_environment: str, code: str) -> None:
    """A local HTTP server speaking a rail's API (demos and tests): by default the MTN MoMo
    Collection and Disbursement APIs; --rail mpesa Daraja's OAuth, STK Push and STK Push Query;
    --rail pawapay pawaPay's v2 deposits and refunds.

    Credentials it accepts are those of VPAY_MTN_SUBSCRIPTION_KEY, VPAY_MTN_API_USER,
    VPAY_MTN_API_KEY (M-Pesa: VPAY_MPESA_CONSUMER_KEY, _CONSUMER_SECRET, _SHORTCODE, _PASSKEY;
    pawaPay: VPAY_PAWAPAY_API_TOKEN); defaults: the sandbox's own, see docs/sandbox.md.
    A port that is busy (or an address not on this host) exits 69 with one line."""
    import signal as _signal
    env = {name: os.environ.get(var) for name, var in (
        ("subscription_key", "VPAY_MTN_SUBSCRIPTION_KEY"), ("api_user", "VPAY_MTN_API_USER"),
        ("api_key", "VPAY_MTN_API_KEY"), ("consumer_key", "VPAY_MPESA_CONSUMER_KEY"),
        ("consumer_secret", "VPAY_MPESA_CONSUMER_SECRET"), ("shortcode", "VPAY_MPESA_SHORTCODE"),
        ("passkey", "VPAY_MPESA_PASSKEY"), ("api_token", "VPAY_PAWAPAY_API_TOKEN"))}
    try:
        if code == "mpesa":
            from vpay.sandbox.mpesa import MpesaSandbox
            rail = MpesaSandbox(host, port, **{k: v for k, v in env.items() if v and k in (
                "consumer_key", "consumer_secret", "shortcode", "passkey")})
        elif code == "pawapay":
            from vpay.sandbox.pawapay import PawaPaySandbox
            rail = PawaPaySandbox(host, port, **{k: v for k, v in env.items() if v and k == "api_token"})
        else:
            from vpay.sandbox.mtn import SandboxRail
            rail = SandboxRail(host, port, success_after_seconds=success_after_seconds,
                               reason_shape=reason_shape, target_environment=target_environment,
                               **{k: v for k, v in env.items() if v and k in ("subscription_key", "api_user",
                                                                               "api_key")})
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
