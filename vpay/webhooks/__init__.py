"""Webhooks to merchants, one module per concern:

* ``policy``: the URL policy (SSRF): which URLs and addresses may be reached;
* ``signing``: secrets, payload bytes and Standard Webhooks signature headers;
* ``transport``: one HTTP attempt, pinned to a checked address, with a total deadline;
* ``schedule``: the retry schedule, what an attempt's answer means for the next;
* ``endpoints``: registration and management of endpoints (``vpay-server webhooks``).

The job handlers (``fanout``, ``deliver``) live in ``vpay.handlers.webhooks``;
nothing here touches the queue. The names below are the package's public
surface, imported from their modules.
"""

from vpay.webhooks.endpoints import MAX_ENDPOINTS_PER_MERCHANT, EndpointLimitReached, add_endpoint, delete_endpoint, get_endpoint, disable_endpoint, enable_endpoint, held_by_policy, hold_endpoint, list_endpoints, redeliver, rotate_secret
from vpay.webhooks.policy import ALLOW_PRIVATE_ENV, Target, UrlRefused, address_problem, allow_private, check_url, resolve_host
from vpay.webhooks.schedule import MAX_ATTEMPTS, RETRY_AFTER_CAP_SECONDS, RETRY_SCHEDULE, Decision, decide, retry_delay
from vpay.webhooks.signing import new_secret, payload, signature, signed_headers
from vpay.webhooks.transport import CONNECT_TIMEOUT_ENV, MAX_RESPONSE_BYTES, READ_TIMEOUT_ENV, Attempt, attempt_deadline, parse_retry_after, post, timeouts

__all__ = [
    "ALLOW_PRIVATE_ENV", "CONNECT_TIMEOUT_ENV", "MAX_ATTEMPTS", "MAX_RESPONSE_BYTES", "READ_TIMEOUT_ENV",
    "RETRY_AFTER_CAP_SECONDS", "RETRY_SCHEDULE", "Attempt", "Decision", "Target", "UrlRefused",
    "MAX_ENDPOINTS_PER_MERCHANT", "EndpointLimitReached", "add_endpoint", "delete_endpoint", "get_endpoint", "address_problem", "allow_private", "attempt_deadline", "check_url", "decide",
    "disable_endpoint", "enable_endpoint", "held_by_policy", "hold_endpoint", "list_endpoints", "new_secret", "parse_retry_after", "payload", "redeliver",
    "post", "resolve_host", "retry_delay", "rotate_secret", "signature", "signed_headers", "timeouts",
]
