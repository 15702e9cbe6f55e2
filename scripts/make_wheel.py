#!/usr/bin/env python3
"""Packs a built axengine tree into a wheel: pip install gives the `axengine` command, its plugins and the C++ SDK.

  scripts/wheel.sh                                              # build (axengine_app) and pack into dist/
  python3 scripts/make_wheel.py --build build --out dist       # pack what build/ holds (CI, tests/wheel/)

The wheel's package directory is exactly what `cmake --install` writes (bin/axengine, bin/plugins/, lib/, include/,
lib/cmake/axengine: find_package(axengine) works from it as from any install prefix), under
site-packages/axengine/, plus a console script that execs bin/axengine. Libraries are found without
LD_LIBRARY_PATH, by run paths relative to the installed file (docs/packaging.md):
  - LibTorch, the NVIDIA runtime libraries and Arrow come from the wheels the package requires (torch, its
    nvidia-* packages, pyarrow; pinned to the versions built against): a run path to each one's directory in
    site-packages;
  - every other library (Boost, oneTBB, toml++, spdlog, fmt, PCRE2, utf8proc, the image codecs, libedit and the
    libbsd, libmd and libtinfo it loads; xxHash is header-only) is bundled in axengine/lib/ (auditwheel's approach:
    the copies are found through $ORIGIN), so the target machine needs only glibc 2.36 and GCC 12's libstdc++
    (Debian 12, Ubuntu 23.04 and newer) and, for the GPU, the NVIDIA driver.
Needs patchelf (scripts/setup.sh installs it) and ldd.
"""
import argparse
import base64
import csv
import hashlib
import importlib.metadata as md
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile

# Libraries every Linux system has and no wheel may bundle (the C library, the C++ runtime, the dynamic loader,
# the GPU driver), as auditwheel's manylinux policies list them.
SYSTEM = re.compile(r"^(linux-vdso|linux-gate|ld-linux[-\w.]*|libc|libm|libdl|librt|libpthread|libutil|libresolv|"
                    r"libgcc_s|libstdc\+\+|libcuda|libnvidia-[\w-]+)\.so(\.[\d.]+)?$")

PY_INIT = '''"""axengine: LoRA/QLoRA fine-tuning engine (C++, LibTorch). The `axengine` command is bin/axengine of this
package; find_package(axengine) works with CMAKE_PREFIX_PATH=axengine.cmake_prefix_path (docs/packaging.md)."""
import os

__version__ = "{version}"
root = os.path.dirname(os.path.abspath(__file__))
executable = os.path.join(root, "bin", "axengine")
plugin_dir = os.path.join(root, "bin", "plugins")
cmake_prefix_path = root
'''

PY_CLI = '''"""The `axengine` console script: replaces this Python process with bin/axengine (same arguments, exit code and
signals), which finds LibTorch and its other libraries through its own run paths."""
import os
import sys

from . import executable


def main():
    os.execv(executable, [executable] + sys.argv[1:])


if __name__ == "__main__":
    main()
'''


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, **kw).stdout


def cache_value(build, key):
    for line in open(os.path.join(build, "CMakeCache.txt")):
        if line.startswith(key + ":"):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"make_wheel: {build}/CMakeCache.txt has no {key}")


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def ldd(path):
    """(soname, resolved path or None) of every library `path` loads, transitively (ldd)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run(["ldd", path], text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env).stdout
    deps = []
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"^(\S+) => (not found|\S+)", line)
        if m:
            deps.append((m.group(1), None if m.group(2) == "not found" else m.group(2)))
        elif line and not line.startswith("statically linked"):
            deps.append((os.path.basename(line.split()[0]), line.split()[0]))
    return deps


def owners(site):
    """site-packages-relative file -> (distribution name, version), from every dist-info's RECORD."""
    out = {}
    for dist in md.distributions(path=[site]):
        for f in dist.files or []:
            out[os.path.normpath(str(f))] = (dist.metadata["Name"], dist.version)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="the CMake build directory (built: axengine_app)")
    ap.add_argument("--out", default="dist", help="where the .whl is written")
    ap.add_argument("--compress-level", type=int, default=6, help="zlib level (1: fastest, for tests)")
    args = ap.parse_args()
    if shutil.which("patchelf") is None:
        sys.exit("make_wheel: patchelf is not on PATH; it sets the wheel's run paths (Debian: apt-get install "
                 "patchelf; scripts/setup.sh installs it)")
    build = os.path.abspath(args.build)
    python = cache_value(build, "AXENGINE_PYTHON")
    version = cache_value(build, "CMAKE_PROJECT_VERSION")
    site = run([python, "-c", "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"]).strip()
    site_real = os.path.realpath(site)
    os.makedirs(args.out, exist_ok=True)

    stage = tempfile.mkdtemp(prefix="axengine-wheel-")
    try:
        pkg = os.path.join(stage, "axengine")
        run(["cmake", "--install", build, "--prefix", pkg])
        elves = []
        for d in ("bin", "lib", os.path.join("bin", "plugins")):
            full = os.path.join(pkg, d)
            for name in sorted(os.listdir(full)) if os.path.isdir(full) else []:
                p = os.path.join(full, name)
                if os.path.isfile(p) and not os.path.islink(p) and is_elf(p):
                    elves.append(p)
        ours = {os.path.basename(p) for p in elves}

        # What each library resolves to: ours, a system library, a wheel's (site-packages), or one to bundle.
        # soname -> its directory relative to site-packages (torch's own and the nvidia wheels' first), for a
        # library the build resolved elsewhere: the CUDA toolkit's libcudart.so.13 is also nvidia/cu13/lib's.
        site_names = {}
        for root, dirs, files in os.walk(site_real):
            dirs.sort(key=lambda d: (d not in ("torch", "nvidia"), d))
            for f in files:
                if ".so" in f:
                    site_names.setdefault(f, os.path.relpath(root, site_real))
        # Where the build's loader finds each library (ldd of every file of ours), then the direct needs (DT_NEEDED)
        # followed from our files into the libraries to bundle, never into a wheel's or the system's.
        resolved = {}
        for elf in elves:
            for soname, path in ldd(elf):
                if path and soname not in resolved:
                    resolved[soname] = path
        wheel_dirs, wheel_libs, bundle, missing = set(), set(), {}, []
        queue = list(elves)
        while queue:
            elf = queue.pop()
            for soname in run(["patchelf", "--print-needed", elf]).split():
                if soname in ours or SYSTEM.match(soname) or soname in bundle:
                    continue
                path = resolved.get(soname)
                real = os.path.realpath(path) if path else None
                if elf not in elves and (not real or real.startswith(site_real + os.sep) or soname in site_names):
                    raise SystemExit(f"make_wheel: the bundled {os.path.basename(elf)} needs {soname} of a wheel: not packable")
                if real and real.startswith(site_real + os.sep):
                    wheel_dirs.add(os.path.relpath(os.path.dirname(real), site_real))
                    wheel_libs.add(os.path.relpath(real, site_real))
                elif soname in site_names:
                    wheel_dirs.add(site_names[soname])
                    wheel_libs.add(os.path.join(site_names[soname], soname))
                elif real:
                    bundle[soname] = real
                    queue.append(real)
                else:
                    missing.append(f"{os.path.relpath(elf, pkg)}: {soname}")
        if missing:
            raise SystemExit("make_wheel: libraries not found: " + ", ".join(missing))

        libdir = os.path.join(pkg, "lib")
        for soname, real in sorted(bundle.items()):
            dst = os.path.join(libdir, soname)
            shutil.copyfile(real, dst)
            os.chmod(dst, 0o755)
            run(["patchelf", "--set-rpath", "$ORIGIN", dst])
        # Our binaries: the package's lib/, then the wheels' directories, each relative to the file.
        for elf in elves:
            here = os.path.relpath(os.path.dirname(elf), stage)  # e.g. axengine/bin/plugins
            entries = ["$ORIGIN" if here == "axengine/lib" else "$ORIGIN/" + os.path.relpath("axengine/lib", here)]
            entries += ["$ORIGIN/" + os.path.relpath(d, here) for d in sorted(wheel_dirs)]
            run(["patchelf", "--set-rpath", ":".join(entries), elf])

        # The distributions those directories belong to, pinned to what the build linked.
        files = owners(site_real)
        requires = {}
        for lib in wheel_libs:
            owner = files.get(os.path.normpath(lib)) or files.get(os.path.normpath(os.path.relpath(os.path.realpath(os.path.join(site_real, lib)), site_real)))
            if not owner:
                raise SystemExit(f"make_wheel: no installed distribution lists {lib} (site-packages {site_real})")
            requires[owner[0]] = owner[1]
        pins = []
        for name, ver in sorted(requires.items(), key=lambda kv: kv[0].lower()):
            pins.append(f"{name}=={ver.split('+')[0]}")  # torch==2.11.0 matches the 2.11.0+cu130 wheel

        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write(PY_INIT.format(version=version))
        with open(os.path.join(pkg, "_cli.py"), "w") as f:
            f.write(PY_CLI)

        name = f"axengine-{version}"
        info = f"{name}.dist-info"
        meta = {
            f"{info}/METADATA": "Metadata-Version: 2.1\nName: axengine\nVersion: " + version + "\n"
            "Summary: LoRA/QLoRA fine-tuning engine for LLMs (C++, LibTorch), with kernel plugins\n"
            "Requires-Python: >=3.10\n" + "".join(f"Requires-Dist: {p}\n" for p in pins),
            f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: axengine scripts/make_wheel.py\nRoot-Is-Purelib: false\n"
            "Tag: py3-none-linux_x86_64\n",
            f"{info}/entry_points.txt": "[console_scripts]\naxengine = axengine._cli:main\n",
        }
        whl = os.path.join(args.out, f"{name}-py3-none-linux_x86_64.whl")
        record = []
        with zipfile.ZipFile(whl + ".part", "w", zipfile.ZIP_DEFLATED, compresslevel=args.compress_level) as z:
            def add(arc, data, mode=0o644):
                zi = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
                zi.external_attr = (stat.S_IFREG | mode) << 16
                zi.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(zi, data, compresslevel=args.compress_level)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                record.append((arc, f"sha256={digest}", str(len(data))))

            for root, dirs, fs in os.walk(pkg):
                dirs.sort()
                for fname in sorted(fs):
                    p = os.path.join(root, fname)
                    arc = os.path.relpath(p, stage)
                    if os.path.islink(p):  # the install's versioned-name links: the file itself once
                        continue
                    with open(p, "rb") as f:
                        add(arc, f.read(), 0o755 if os.access(p, os.X_OK) else 0o644)
            for arc, text in meta.items():
                add(arc, text.encode())
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerows(record)
            w.writerow((f"{info}/RECORD", "", ""))
            zi = zipfile.ZipInfo(f"{info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (stat.S_IFREG | 0o644) << 16
            z.writestr(zi, buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
        os.replace(whl + ".part", whl)
        print(f"make_wheel: {whl} ({os.path.getsize(whl) / 2**20:.0f} MiB); bundled: {', '.join(sorted(bundle)) or 'none'}; "
              f"requires: {', '.join(pins)}", file=sys.stderr)
        print(whl)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


if __name__ == "__main__":
    main()
