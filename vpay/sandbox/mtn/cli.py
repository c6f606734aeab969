"""``python -m vpay.sandbox.mtn``: the MoMo sandbox on its own, until Ctrl-C
or SIGTERM (``vpay-server sandbox-rail`` is the installed command)."""

from __future__ import annotations

import logging

from vpay.sandbox.mtn.codes import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_SUBSCRIPTION_KEY
from vpay.sandbox.mtn.rail import SandboxRail


def main(argv: list[str] | None = None) -> int:
    """``python -m vpay.sandbox.mtn [--port N]``: run a sandbox until Ctrl-C / SIGTERM."""
    import argparse
    import signal

    p = argparse.ArgumentParser(prog="python -m vpay.sandbox.mtn",
                                description="Local MTN MoMo Collection sandbox (test/demo double).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8089)
    p.add_argument("--subscription-key", default=DEFAULT_SUBSCRIPTION_KEY)
    p.add_argument("--api-user", default=DEFAULT_API_USER)
    p.add_argument("--api-key", default=DEFAULT_API_KEY)
    p.add_argument("--target-environment", default="sandbox")
    p.add_argument("--success-after", type=float, default=3.0, help="seconds until a payment succeeds")
    p.add_argument("--reason-shape", choices=("string", "object"), default="string",
                   help="a FAILED status's reason: a plain string (MTN's published shape) or {code, message}")
    p.add_argument("--callback-host", action="append", default=None, metavar="HOST",
                   help="allow callbacks to HOST (repeatable; '*' = any); default: loopback only")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rail = SandboxRail(args.host, args.port, subscription_key=args.subscription_key,
                       api_user=args.api_user, api_key=args.api_key,
                       target_environment=args.target_environment,
                       success_after_seconds=args.success_after, reason_shape=args.reason_shape,
                       callback_hosts=args.callback_host)
    signal.signal(signal.SIGTERM, lambda *_: rail.stop())
    rail.serve_forever()
    return 0
