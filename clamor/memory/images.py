"""The driver's images, and whether a joining worker runs the same ones.

A worker that was not forked runs the tasks the driver pickled, against
the region the driver built: with another numpy or another Python it could
read the same bytes differently.  So at joining, the driver sends the
images it has loaded (the executable, libpython, every extension module
and shared library: the ELF files mapped in its address space) and the
worker checks each against its own copy of the file: the same GNU build-id
where the file has one, else the same size and SHA-256.  A difference
refuses the worker, naming the library and both versions.

Files are named portably: one under a directory of ``sys.path`` (site-
packages) or under ``sys.prefix`` by its path relative to it, anything else
(libc, system libraries) by its absolute path.  The worker looks for the
same relative path under its own directories.
"""
import functools
import hashlib
import os
import struct
import sys
import sysconfig

__all__ = ["installed", "loaded", "mismatches", "packages"]

_NT_GNU_BUILD_ID = 3


def build_id(path):
    """The GNU build-id of the ELF file ``path`` (hex), or None."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
                return None            # only 64-bit little-endian ELF (the platform clamor runs on)
            phoff, = struct.unpack_from("<Q", ident, 32)
            phentsize, phnum = struct.unpack_from("<HH", ident, 54)
            f.seek(phoff)
            phdrs = f.read(phentsize * phnum)
            for i in range(phnum):
                ptype, _, offset, _, _, filesz = struct.unpack_from("<IIQQQQ", phdrs, i * phentsize)
                if ptype != 4 or filesz > 1 << 16:     # PT_NOTE
                    continue
                f.seek(offset)
                notes = f.read(filesz)
                pos = 0
                while pos + 12 <= len(notes):
                    namesz, descsz, ntype = struct.unpack_from("<III", notes, pos)
                    name_end = pos + 12 + ((namesz + 3) & ~3)
                    desc = notes[name_end:name_end + descsz]
                    if ntype == _NT_GNU_BUILD_ID and notes[pos + 12:pos + 12 + namesz].rstrip(b"\0") == b"GNU":
                        return desc.hex()
                    pos = name_end + ((descsz + 3) & ~3)
    except (OSError, struct.error):
        return None
    return None


def _roots():
    """Directories files are named relative to: ``sys.path`` in its order
    (where imports look), then the installation's prefixes."""
    return _roots_of(tuple(sys.path))


@functools.lru_cache(maxsize=8)
def _roots_of(path):
    # (once for each sys.path: sysconfig's paths are expanded anew at each
    # call, which made naming the 280 images of a PyData process take 1.5 s
    # at every worker's joining)
    dirs = [p for p in path if p and os.path.isdir(p)]
    dirs += [sysconfig.get_paths().get(k) for k in ("platlib", "purelib", "stdlib", "platstdlib")]
    dirs += [sys.prefix, sys.base_prefix, sys.exec_prefix]
    out = []
    for d in dirs:
        if d:
            d = os.path.realpath(d)
            if d not in out:
                out.append(d)
    return out


def portable_name(path):
    """"rel:" and the path relative to the most specific root that holds
    it, else the absolute path."""
    real = os.path.realpath(path)
    for root in _longest_first(tuple(sys.path)):
        if real.startswith(root + os.sep):
            return "rel:" + os.path.relpath(real, root)
    return real


@functools.lru_cache(maxsize=8)
def _longest_first(path):
    return sorted(_roots_of(path), key=len, reverse=True)


def local_path(name):
    """This process's file for a portable name, or None: the first root, in
    import order, that holds it."""
    if not name.startswith("rel:"):
        return name if os.path.exists(name) else None
    rel = name[4:]
    for root in _roots():
        p = os.path.join(root, rel)
        if os.path.exists(p):
            return p
    return None


@functools.lru_cache(maxsize=None)
def _fingerprint(path, size, mtime):
    bid = build_id(path)
    if bid is not None:
        return {"build_id": bid}
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def fingerprint(path):
    st = os.stat(path)
    return _fingerprint(os.path.realpath(path), st.st_size, st.st_mtime_ns)


# (importlib.metadata is imported where it is used: it costs 90 ms, and a
# process that never joins workers it did not fork never asks)


@functools.lru_cache(maxsize=1)
def _distributions():
    import importlib.metadata
    try:
        return importlib.metadata.packages_distributions()
    except Exception:   # a broken metadata directory: versions are only for the message
        return {}


@functools.lru_cache(maxsize=None)
def _dist_version(dist):
    """The version of installed distribution ``dist``, or None.  (Read once
    each: its metadata is parsed as an e-mail, 9 ms, and a PyData process's
    images belong to some 200 of them.)"""
    import importlib.metadata
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_of(name):
    """What to call the file that ``name`` names in a message: its package
    and version where it belongs to one."""
    rel = name[4:] if name.startswith("rel:") else os.path.basename(name)
    top = rel.split(os.sep)[0]
    if top.endswith(".libs"):          # auditwheel's folder of vendored libraries: numpy.libs
        top = top[:-5]
    version = packages_version(top)
    if version is not None:
        return version
    if "libpython" in rel or os.path.realpath(sys.executable).endswith(rel):
        return f"Python {sys.version.split()[0]}"
    return os.path.basename(rel)


def _mapped():
    """The files mapped in this process (its images among them)."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/") and parts[3] != "00:00":
                p = parts[5].strip()
                if not p.endswith(" (deleted)") and not p.startswith(("/dev/", "/memfd:")):
                    paths.add(p)
    return paths


def installed(name):
    """Whether top-level module ``name`` comes from an installed
    distribution (site-packages, an editable install, a wheel on the
    path): not shipped to workers, which must have it."""
    return bool(_distributions().get(name))


def packages():
    """{"pkg:" + name: its version} of the installed packages this process
    imported (top-level modules a distribution provides), so that a worker
    without one, or with another version, is told at joining rather than
    by a task that fails to unpickle."""
    out = {}
    for name, mod in list(sys.modules.items()):
        if "." in name or mod is None:
            continue
        version = packages_version(name)
        # (only what a distribution provides; not clamor, nor what site
        # imports at start-up for the installer: _distutils_hack, the
        # finders of editable installs)
        if version is None or name in ("clamor", "_distutils_hack") or name.startswith("__editable__"):
            continue
        out["pkg:" + name] = {"what": version}
    return out


def loaded():
    """{portable name: fingerprint} of the ELF files mapped in this process,
    and the installed packages it imported (``packages()``)."""
    out = packages()
    for p in sorted(_mapped()):
        try:
            with open(p, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    continue
            out[portable_name(p)] = {**fingerprint(p), "what": version_of(portable_name(p))}
        except OSError:
            continue
    return out


def mismatches(driver):
    """Lines saying how this process's files differ from ``driver``'s
    images (``loaded()`` of the driver); empty if they all match."""
    out = []
    # The interpreter's own files (the executable, libpython: named under
    # the installation's prefix) are the ones this process has mapped: a
    # root searched first, such as the working directory "/" of a worker
    # started there, may hold another file by the same relative name
    # (/bin/python3.11).  A module's file is the one imports would find.
    mine = {}
    for p in _mapped():
        n = portable_name(p)
        if n.startswith(("rel:bin/", "rel:lib/")):
            mine.setdefault(n, p)
    for name, want in sorted(driver.items()):
        if name.startswith("pkg:"):
            out += _package_mismatch(name[4:], want.get("what"))
            continue
        path = mine.get(name) or local_path(name)
        if path is None:
            out.append(f"{want.get('what', name)}: the driver has {name.removeprefix('rel:')}, this worker has no "
                       f"such file")
            continue
        try:
            have = fingerprint(path)
        except OSError as err:
            out.append(f"{want.get('what', name)}: cannot read {path}: {err}")
            continue
        same = (have.get("build_id") == want.get("build_id") if "build_id" in want or "build_id" in have
                else have.get("sha256") == want.get("sha256") and have.get("size") == want.get("size"))
        if not same:
            out.append(f"{name.removeprefix('rel:')} differs: the driver has {want.get('what')}, this worker "
                       f"{version_of(name)} ({path})")
    return out


def _package_mismatch(name, what):
    import importlib.util
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return [f"{what or name}: the driver imported package {name!r}, which this worker cannot import "
                f"(install it here: clamor ships the user's own modules, not installed packages)"]
    mine = packages_version(name)
    if what and mine and what != mine:
        return [f"package {name!r} differs: the driver has {what}, this worker {mine}"]
    return []


def packages_version(name):
    """"dist version" of the installed package ``name``, or None."""
    for dist in _distributions().get(name, ()):
        version = _dist_version(dist)
        if version is not None:
            return f"{dist} {version}"
    return None
