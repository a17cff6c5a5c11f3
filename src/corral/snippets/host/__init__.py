"""The host side of snippets: the warm pool, ``run_snippet``, the transcript and the stack
sanitizer."""
