"""The alert kinds (contract: "Tables", ``alerts.kind``), in one place: the
metrics report each of them (0 when absent) and the operator commands refuse
a ``--kind`` that is not one of them."""

ALERT_KINDS: tuple[str, ...] = (
    "charge_unresolved", "rail_contradiction", "job_dead_lettered", "refund_unresolved",
    "rail_misconfigured", "webhook_endpoint_disabled", "missing_from_statement",
    "unknown_rail_transaction")
"""Every kind an ``alerts`` row may have (contract: "Tables")."""
