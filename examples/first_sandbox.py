"""A sandbox with files, from sync code (the README's first screen runs this).

Strict where the host can run it (namespaces, seccomp, cgroups, no network), destroyed
when the ``with`` block ends. Paths are relative to the sandbox's /work."""

from corral.sandbox import Sandbox

with Sandbox.create() as sb:
    sb.files.make_dir("data")
    sb.files.write("data/fruit.txt", "pear\napple\nfig\n")
    sb.files.write("count.py", "import sys\nprint(len(sys.stdin.readlines()), 'lines')\n")
    for f in sb.files.list(depth=2):  # two levels: /work's entries and data's
        print(f.type, f.path, f.size)
    r = sb.commands.run("sort data/fruit.txt > data/sorted.txt; python3 count.py < data/sorted.txt")
    print(r.outcome, r.level, r.stdout_text.strip())
    print(sb.files.read("data/sorted.txt").split())
    sb.files.remove("data", recursive=True)
    print("data still there:", sb.files.exists("data"))
