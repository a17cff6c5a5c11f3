"""Policy as pure data: the plan (spec + host facts -> frozen steps) and the seccomp filter."""
