"""The processes that build and serve a sandbox: the fork server (zygote) and its template,
the sandbox's pid 1 and view builder, and the agent; the containment checklist they run."""
