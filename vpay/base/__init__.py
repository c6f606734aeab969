"""The foundation every layer may use: which Postgres and its pool, the named
SQL, settings from the environment, JSON logs, the Prometheus metrics, the
kill points of crash tests and the bounded outbound HTTP call. It imports
nothing else of vpay."""
