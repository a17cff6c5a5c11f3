"""The pure core: the closed error set, the value types, the provider contract, cancellation
and the one sync adapter. No I/O; every other layer imports from here, and this imports
nothing of corral above it."""
