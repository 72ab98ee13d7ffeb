# Tries to leave its process cap through cgroupfs: raise its own cgroup's pids.max, move itself to
# an ancestor cgroup (its parent and the hierarchy's root), and make a cgroup of its own. Says, in
# its error, which of those worked ("escaped: ...") or that every one was refused.
import os


def _mounts():
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if tail and tail[0] in ("cgroup", "cgroup2"):
                out.append((fields[4], fields[3], tail[0], tail[2] if len(tail) > 2 else ""))
    return out


def run(x, a, b):
    worked, refused = [], []
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            own["v2" if hierarchy == "0" else controllers] = path
    # Every cgroup mount the candidate can see, and where the sandbox's own folders would be on the
    # host's usual mount points even if nothing is mounted here.
    places = [point for point, _root, _kind, _opts in _mounts()] + ["/sys/fs/cgroup", "/sys/fs/cgroup/pids"]
    for top in dict.fromkeys(places):
        for path in dict.fromkeys(own.values()):
            here = os.path.join(top, path.lstrip("/"))
            tries = [(os.path.join(here, "pids.max"), "max"),
                     (os.path.join(os.path.dirname(here), "cgroup.procs"), str(os.getpid())),
                     (os.path.join(top, "cgroup.procs"), str(os.getpid()))]
            for target, text in tries:
                try:
                    with open(target, "w") as f:
                        f.write(text)
                    worked.append(target)
                except OSError as exc:
                    refused.append(f"{target}: {exc.strerror}")
            try:
                os.mkdir(os.path.join(here, "mine"))
                worked.append(os.path.join(here, "mine"))
            except OSError as exc:
                refused.append(f"mkdir: {exc.strerror}")
    if worked:
        raise RuntimeError(f"escaped: {', '.join(worked)}")
    raise RuntimeError(f"every cgroup write refused ({len(refused)} tries)")
