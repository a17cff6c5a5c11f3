"""The wires: one sans-I/O codec per wire, stdlib only, imported by both of its ends
(see docs/wires.md and docs/protocol.md)."""
