-- The worker's own upkeep of the queue table (vpay/engine/vacuum.py).

-- name: vacuum_jobs
-- Run by the worker after every VPAY_JOBS_VACUUM_EVERY finished jobs, on an
-- autocommit connection of its own (VACUUM cannot run in a transaction).
-- SKIP_LOCKED: if jobs is being vacuumed already (another replica,
-- autovacuum) this one is skipped with a WARNING at once rather than queued.
-- INDEX_CLEANUP ON: the dead entries at the head of the claim indexes are
-- what slows every claim; never skip the index pass. TRUNCATE OFF: returning
-- the table's empty tail pages takes an ACCESS EXCLUSIVE lock that would
-- stall the claims, for pages the queue fills again at once.
VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE OFF) jobs;
