"""Local OCI images -> root filesystems: reading sources and layers, confined extraction in
a bounded child, and the size-capped cache (used by the providers that run ``spec.image``)."""
