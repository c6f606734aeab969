-- The settle's statements are planned once per connection, not five times
-- and more (issue 30, Postgres CPU per settled charge). A PL/pgSQL function
-- plans each of its statements with the plan cache's default rule: custom
-- plans for the first five calls on a connection, then a generic plan if it
-- looks no dearer. vpay_charge_settle's settle is one large data-modifying
-- CTE whose every read is by primary key, so a custom plan is never better
-- than the generic one, and the planning is the cost: with pg_stat_statements
-- on the bench (bench/charges.py, 300 charges, a worker's pool of connections)
-- the settle took 1.37 ms per call with an endpoint, 1.04 ms without, of
-- which its statements' own execution was 0.85 and 0.59 ms; with generic
-- plans from the first call, 1.00 and 0.81 ms (docs/performance.md, "A
-- fourth run"). Every connection a worker's pool opens (and
-- replaces) pays this again, so it counts at start and after each rotation.
ALTER FUNCTION vpay_charge_settle(text, text, text, text, boolean, text, text, text, text)
    SET plan_cache_mode = force_generic_plan;
