"""The oci provider: level ``strict`` on an existing OCI runtime (Debian's ``crun``, or
gVisor's ``runsc`` where installed): ``corral.provider("oci", runtime="crun")``.

See ``docs/providers/oci.md`` for what it enforces and what it does not.
"""

from __future__ import annotations

from corral.providers.oci._provider import OciProvider as OciProvider, OciSandbox as OciSandbox

__all__ = ["PROVIDER_CLASS", "OciProvider", "OciSandbox"]

#: the class the registry (corral.providers) hands out for "oci"
PROVIDER_CLASS = OciProvider
