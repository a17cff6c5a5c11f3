"""The bounded-run engine, below the providers: one process tree held by a supervisor
(``tree``), run, bounded and reaped (``engine.BoundedRun``) with checked options
(``options.RunOptions``). The subproc and oci providers run their commands on it;
the front door ``corral.run.bounded`` (``run_bounded``) is its public face."""
