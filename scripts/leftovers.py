#!/usr/bin/env python3
"""The end of the test command: fails when a process, mount or loop device that the run
started is still there, listing them, and then removes them so the next run starts clean.

Only what *this run* started is looked at; other runs and the developers' own services (a
nats-server on 4222, postgres) share the machine. `scripts/test.sh` gives everything it
starts a run id in the environment (ROLLOUT_TEST_RUN) and a temporary root of its own
(TMPDIR, named after the run id), under which every test keeps its state. A process is
the run's when its environment carries the run id, when its command line or working
directory names the root, or when it is a sandbox (a mount namespace of its own, its
environment cleared) whose binds come from below the root. A mount is the run's when its
mount point is below the root; a loop device, when its backing file is (deleted or not).
With --database, a Postgres database is the run's when its name carries the run's tag
(rollout-test-support names each test's `rollout_test_TAG_…`, and the run's template
`rollout_tpl_TAG_…`): the template is the run's to drop and is dropped, a test's
database is a leftover.

    leftovers.py --run ID --root DIR [--database ADMIN_URL] [--no-clean]
"""

import argparse
import os
import signal
import subprocess
import sys
import time


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def link(path):
    try:
        return os.readlink(path)
    except OSError:
        return ""


def under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def ancestors():
    """This process and the ones it runs under (the test command's own shell)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        for line in read(f"/proc/{pid}/status").decode(errors="replace").splitlines():
            if line.startswith("PPid:"):
                pid = int(line.split()[1])
                break
        else:
            break
    return out


def processes(run, root):
    name = os.path.basename(root)
    marker = f"ROLLOUT_TEST_RUN={run}".encode()
    mine, my_ns = ancestors(), link("/proc/self/ns/mnt")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        pid = int(entry)
        cmdline = read(f"/proc/{pid}/cmdline")
        if not cmdline:
            continue  # a kernel thread, a zombie, or gone
        environ = read(f"/proc/{pid}/environ").split(b"\0")
        ours = marker in environ or root.encode() in cmdline
        ours = ours or under(link(f"/proc/{pid}/cwd"), root)
        if not ours and link(f"/proc/{pid}/ns/mnt") not in ("", my_ns):
            for line in read(f"/proc/{pid}/mountinfo").decode(errors="replace").splitlines():
                fields = line.split(" ")
                if len(fields) > 3 and (under(fields[3], root) or name in fields[3].split("/")):
                    ours = True
                    break
        if ours:
            cmd = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
            found.append((pid, cmd[:160]))
    return found


def mounts(root):
    points = []
    for line in read("/proc/self/mountinfo").decode(errors="replace").splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if under(point, root):
                points.append(point)
    return points


def loop_devices(root):
    found = []
    for dev in sorted(os.listdir("/sys/block")) if os.path.isdir("/sys/block") else []:
        backing = read(f"/sys/block/{dev}/loop/backing_file").decode(errors="replace").strip()
        if backing and under(backing.removesuffix(" (deleted)"), root):
            found.append((f"/dev/{dev}", backing))
    return found


def run_tag(run):
    """The run's tag in database names, as rollout-test-support's `run_tag` makes it."""
    return "".join(c.lower() if c.isascii() and c.isalnum() else "_" for c in run)[:16]


def psql(url, sql):
    out = subprocess.run(
        ["psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"psql: {out.stderr.strip()}")
    return [line for line in out.stdout.splitlines() if line]


def drop_database(url, name):
    psql(url, f'ALTER DATABASE "{name}" WITH IS_TEMPLATE false')
    psql(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def databases(url, run):
    """The run's test databases left on the server (its templates are dropped here)."""
    tag = run_tag(run)
    names = psql(url, "SELECT datname FROM pg_database")
    for name in names:
        if name.startswith(f"rollout_tpl_{tag}_"):
            drop_database(url, name)
    return [n for n in names if n.startswith(f"rollout_test_{tag}_")]


def clean(procs, points, loops):
    for pid, _ in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for point in sorted(points, key=lambda p: -p.count("/")):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    time.sleep(1)
    for dev, _ in loops:
        # Loop devices set up by `mount -o loop` go by themselves once unmounted.
        if os.path.exists(f"/sys/block/{os.path.basename(dev)}/loop/backing_file"):
            subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="the run id (ROLLOUT_TEST_RUN)")
    ap.add_argument("--root", required=True, help="the run's temporary root")
    ap.add_argument("--database", help="the Postgres server the tests used (an admin URL)")
    ap.add_argument("--no-clean", action="store_true", help="only report")
    args = ap.parse_args()
    root = os.path.realpath(args.root)
    # What a stop set going (a sandbox's last process, a lazily detached mount) may take
    # a moment to be gone.
    deadline = time.monotonic() + 30
    while True:
        procs, points, loops = processes(args.run, root), mounts(root), loop_devices(root)
        if not (procs or points or loops) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    dbs = []
    if args.database:
        try:
            dbs = databases(args.database, args.run)
        except (OSError, RuntimeError) as e:
            print(f"== leftover check FAILED: cannot list the databases at {args.database}: {e}",
                  file=sys.stderr)
            return 1
    if not (procs or points or loops or dbs):
        print("== leftover check: nothing the run started is left", file=sys.stderr)
        return 0
    print(f"== leftover check FAILED: the run ({args.run}, {root}) left behind:", file=sys.stderr)
    for pid, cmd in procs:
        print(f"   process {pid}: {cmd}", file=sys.stderr)
    for point in points:
        print(f"   mount {point}", file=sys.stderr)
    for dev, backing in loops:
        print(f"   loop device {dev} -> {backing}", file=sys.stderr)
    for name in dbs:
        print(f"   database {name}", file=sys.stderr)
    if not args.no_clean:
        clean(procs, points, loops)
        for name in dbs:
            drop_database(args.database, name)
        print("== leftover check: removed them (the run still fails)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
