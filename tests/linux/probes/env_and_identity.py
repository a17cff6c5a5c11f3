"""What the sandbox reveals: host env secrets, interfaces, hostname, privileges."""

import json
import os
import socket
import sys


def emit(probe: str, ok: bool, detail: str) -> None:
    print(json.dumps({"probe": probe, "ok": ok, "detail": detail}), flush=True)


def status_fields() -> dict[str, str]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def read(path: str) -> str:
    try:
        with open(path) as f:
            return " ".join(f.read().split())
    except OSError as e:
        return f"unreadable: {e.strerror}"


def main() -> None:
    params = json.loads(sys.argv[1])
    secret = params["secret_name"]
    emit("env_secret_visible", secret in os.environ, ",".join(sorted(os.environ)))
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError as e:
        names = [f"error: {e.strerror}"]
    emit("host_interfaces_visible", any(n != "lo" for n in names), ",".join(names))
    host = socket.gethostname()
    emit("hostname_not_sandbox", host != "sandbox", host)
    st = status_fields()
    caps = {k: st.get(k, "?") for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    emit("capabilities_present", any(v.strip("0") for v in caps.values()), json.dumps(caps))
    emit("no_new_privs_unset", st.get("NoNewPrivs") != "1", f"NoNewPrivs: {st.get('NoNewPrivs')}")
    emit("seccomp_off", st.get("Seccomp") != "2", f"Seccomp: {st.get('Seccomp')}")
    uid_map = read("/proc/self/uid_map")
    # root inside = root outside when the uid map is the host's identity map
    emit("uid_map_is_host_identity", uid_map == "0 0 4294967295", f"uid_map: {uid_map}; "
         f"gid_map: {read('/proc/self/gid_map')}; uid={os.getuid()} euid={os.geteuid()}")


main()
