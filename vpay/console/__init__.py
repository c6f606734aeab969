"""The operator console: a server-rendered web console on its own port
(``vpay-server console``), for the human step: payments' timelines, the
unresolved-charge workbench with maker-checker, alerts, jobs, statements,
webhooks and the audit trail (docs/console.md). Every action calls the same
functions as the CLI."""
