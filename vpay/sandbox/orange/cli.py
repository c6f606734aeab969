"""``python -m vpay.sandbox.orange``: the Orange sandbox on its own, until Ctrl-C."""

from __future__ import annotations

import logging

from vpay.sandbox.orange.sandbox import OrangeSandbox


def main(argv: list[str] | None = None) -> int:
    """``python -m vpay.sandbox.orange [--port N]``: serve until Ctrl-C."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m vpay.sandbox.orange",
                                description="Local Orange Money Web Payment sandbox (test/demo double).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--country", default="dev")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sandbox = OrangeSandbox(args.host, args.port, country=args.country)
    try:
        sandbox.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
