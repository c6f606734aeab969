"""Statement reconciliation: read a rail's transaction statement (CSV), judge
every line against our charges and refunds, and settle what it proves.

``reader`` (bytes → header and rows; bad files refused), ``profiles`` (column
names → map keys), ``lines`` (rows → typed lines), ``matcher`` (lines →
judgements; reads only), ``importer`` (dry run or ``--apply``, one
transaction), ``report`` (summary table, JSON, exceptions CSV). The rules are
in docs/flows/statements.md; names in docs/design/contract.md.
"""
