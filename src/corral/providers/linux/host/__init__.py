"""The host side of the strict Linux provider: the provider and its sandboxes, the channel to
each agent, cgroups, the CPU watcher, spares and host detection."""
