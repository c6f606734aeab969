-- The jobs table is a queue: every job is inserted, updated at claim (a new
-- row version: the claim changes columns the claim indexes filter on, so it
-- is never a HOT update) and deleted at finish. Each finished job leaves dead
-- entries at the head of the claim indexes (jobs_claimable, and
-- jobs_claimable_lane when lanes exist), exactly where every claim starts its
-- ordered scan, until VACUUM removes them (issue #15, "Churn": 276 index
-- pages walked per claim after 100k jobs without vacuum, vs 3).
--
-- Postgres's defaults wait for 20 % of the table to be dead (scale factor
-- 0.2) and throttle the vacuum (cost delay 2 ms): on a queue that is a
-- growing head of dead entries between rare, slow vacuums. These per-table
-- settings make autovacuum take jobs whenever 2,000 rows are dead, whatever
-- its size, and run unthrottled: its pages are hot in shared buffers, and a
-- vacuum that falls behind a queue's churn never catches up. The launcher
-- still visits a database once per autovacuum_naptime (server-wide, 1 min
-- by default); set it lower server-wide for a busier queue
-- (docs/performance.md, "Churn").
--
-- Inserts count too (insert threshold): a big batch enqueued at once gets its
-- visibility map and statistics promptly, so the claim plans stay index scans.
ALTER TABLE jobs SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);
