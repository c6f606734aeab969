-- What the database's commits wait for (vpay/base/replication.py): the two
-- settings that decide whether a commit this session makes is on a standby
-- before it returns. current_setting reads this session's values, which are
-- what our commits obey (a role or database may override the server's).

-- name: commit_mode
SELECT current_setting('synchronous_standby_names') AS synchronous_standby_names,
       current_setting('synchronous_commit') AS synchronous_commit;
