"""What operators see of a node: per-request observations (record), metrics across sibling processes
(multiproc), traces (tracing), the access log (access_log), all fed by one HTTP middleware (observe)."""
