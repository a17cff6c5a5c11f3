"""The in-sandbox side of snippets: the worker that runs one snippet (stdlib only) and its
run-time guards. Imported inside sandboxes only."""
