"""What a program sees from inside corral's strict sandbox (the README's main job).

Each line tries something a hostile program would try and prints what happened.
"""

import os
import socket

print(f"hostname {socket.gethostname()!r}, uid {os.getuid()}, pid {os.getpid()}")
print(f"cwd {os.getcwd()}, / holds {sorted(os.listdir('/'))}")
with open("/proc/self/status") as f:
    status = dict(line.split(":\t", 1) for line in f if ":\t" in line)
print(f"capabilities {status['CapEff'].strip()}, no_new_privs {status['NoNewPrivs'].strip()},"
      f" seccomp mode {status['Seccomp'].strip()}")
print(f"processes visible: {sorted(int(p) for p in os.listdir('/proc') if p.isdigit())}")
print(f"network interfaces: {[name for _, name in socket.if_nameindex()]}")
for path in ("/etc/shadow", "/root", "/home", "/usr/bin/evil"):
    try:
        with open(path, "w" if path.startswith("/usr") else "r"):
            pass
        print(f"{path}: opened (!)")
    except OSError as e:
        print(f"{path}: refused ({e.strerror})")
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    print("raw socket: opened (!)")
except OSError as e:
    print(f"raw socket: refused ({e.strerror})")
with open("/work/note.txt", "w") as f:
    f.write("the private work dir is writable\n")
print("wrote /work/note.txt (gone when the sandbox is destroyed)")
