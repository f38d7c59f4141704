#!/usr/bin/env python3
"""What the GPU machine offers a mixprec run: GPU, driver, OS, glibc, toolkit, and where its CUDA
libraries are (PyTorch's wheels, /usr/local/cuda) with their versions. Part of scripts/gpu/run.sh.

Usage: inventory.py [--manifest gpu-pack/manifest.json] [--torch-python PY] --json-out FILE
Prints a readable report; FILE gets the facts, the library directories chosen for LD_LIBRARY_PATH
("lib_dirs") and whether the runtime libraries are at least as new as the bundle was built against
("bundle_versions_ok", "version_notes"). Standard library only; torch is asked in a child process.
"""

import argparse
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys

# soname stem -> the major version a CUDA 13 build of mixprec needs (cudnn: 9).
LIBS = {"libcublasLt": 13, "libcublas": 13, "libcudnn": 9, "libcudart": 13, "libnvrtc": 13,
        "libnvJitLink": 13}
HEADERS = ("cudnn_version.h", "cublas_api.h", "cublasLt.h", "cuda_runtime.h")


def sh(cmd, timeout=60):
    """(exit status, stdout+stderr) of a command; (None, why) when it cannot start."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, (p.stdout + p.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)


def search_roots(torch_python):
    """Directories that may hold CUDA libraries or headers, most specific first."""
    roots = []
    # The torch interpreter's site-packages: PyTorch's CUDA wheels live in site-packages/nvidia/.
    rc, out = sh([torch_python, "-c", "import site, sys; print('\\n'.join(site.getsitepackages() + sys.path))"])
    if rc == 0:
        roots += [os.path.join(p, "nvidia") for p in out.splitlines() if p.endswith("-packages")]
        roots += [os.path.join(p, "torch", "lib") for p in out.splitlines() if p.endswith("-packages")]
    roots += sorted(glob.glob("/usr/local/cuda*")) + ["/usr/local/nvidia", "/usr/lib/x86_64-linux-gnu",
                                                      "/usr/lib64", "/usr/include", "/opt"]
    seen, out_roots = set(), []
    for r in roots:
        real = os.path.realpath(r)
        if os.path.isdir(real) and real not in seen:
            seen.add(real)
            out_roots.append(r)
    return out_roots


def find_files(roots, max_depth=6):
    """{name: [paths]} for the CUDA libraries (versioned sonames) and headers under roots."""
    lib_re = re.compile(r"^(" + "|".join(map(re.escape, LIBS)) + r")\.so\.\d+(\.\d+)*$")
    found, seen = {}, set()
    for root in roots:
        base_depth = root.rstrip("/").count("/")
        for d, dirs, files in os.walk(root, followlinks=False):
            if d.count("/") - base_depth >= max_depth:
                dirs[:] = []
            # /opt holds whole applications: only a torch environment's nvidia/ is of interest there.
            dirs[:] = [x for x in dirs if not x.startswith(".") or x == ".venv"]
            for f in files:
                if lib_re.match(f) or f in HEADERS:
                    p = os.path.join(d, f)
                    real = os.path.realpath(p)
                    if real in seen:
                        continue
                    seen.add(real)
                    found.setdefault(f.split(".so")[0] if ".so." in f else f, []).append(p)
    return found


PROBE = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
name = sys.argv[2]
if name == "libcudart":
    v = ctypes.c_int(0); lib.cudaRuntimeGetVersion(ctypes.byref(v)); print(v.value)
elif name == "libcudnn":
    lib.cudnnGetVersion.restype = ctypes.c_size_t; print(lib.cudnnGetVersion())
elif name in ("libcublasLt",):
    lib.cublasLtGetVersion.restype = ctypes.c_size_t; print(lib.cublasLtGetVersion())
elif name == "libnvrtc":
    a, b = ctypes.c_int(0), ctypes.c_int(0); lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b)); print(a.value * 1000 + b.value * 10)
"""


def lib_version(path, stem):
    """The library's own version call, in a child process (two copies of one soname in one
    process would be one library). Falls back to the file name's version."""
    rc, out = sh([sys.executable, "-c", PROBE, path, stem], timeout=30)
    if rc == 0 and out.strip().isdigit():
        n = int(out.strip().splitlines()[-1])
        if stem == "libcudnn":  # 91900 -> 9.19.0
            return f"{n // 10000}.{n % 10000 // 100}.{n % 100}"
        if stem == "libcublasLt":  # 130100 -> 13.1.0
            return f"{n // 10000}.{n % 10000 // 100}.{n % 100}"
        return f"{n // 1000}.{n % 1000 // 10}"  # cudart, nvrtc: 13000 -> 13.0
    m = re.search(r"\.so\.([\d.]+)$", os.path.realpath(path))
    return m.group(1) if m else "?"


def vtuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", v or "")) or (0,)


def torch_facts(torch_python, want_gpu):
    """Versions torch reports, its GPU view, and which CUDA libraries it actually loads."""
    code = r"""
import json, os, sys
r = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import torch
except Exception as e:
    print(json.dumps({**r, "error": f"import torch: {e}"})); sys.exit(0)
r.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
try:
    r["cudnn"] = torch.backends.cudnn.version()
except Exception as e:
    r["cudnn"] = f"? ({e})"
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    r.update(device=p.name, capability=list(torch.cuda.get_device_capability(0)),
             sms=p.multi_processor_count, memory_bytes=p.total_memory)
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    (a @ a).float().sum().item()  # loads cuBLAS/cuBLASLt
    x = torch.randn(8, 4, 16, 16, device="cuda")
    torch.nn.functional.conv2d(x, torch.randn(4, 4, 3, 3, device="cuda")).sum().item()  # loads cuDNN
    torch.cuda.synchronize()
    loaded = set()
    for line in open("/proc/self/maps"):
        path = line.split()[-1] if "/" in line else ""
        base = os.path.basename(path)
        if base.startswith(("libcublas", "libcudnn", "libcudart", "libnvrtc", "libnvJitLink")):
            loaded.add(path)
    r["loaded_libs"] = sorted(loaded)
print(json.dumps(r))
"""
    rc, out = sh([torch_python, "-c", code], timeout=180)
    line = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        return json.loads(line)
    except ValueError:
        return {"error": f"{torch_python} exited {rc}: {out[-500:]}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", help="gpu-pack/manifest.json: the versions the bundle was built against")
    ap.add_argument("--torch-python", default="python3")
    ap.add_argument("--json-out", required=True)
    a = ap.parse_args()
    facts = {}

    # Machine and OS.
    osr = {}
    if os.path.exists("/etc/os-release"):
        for line in open("/etc/os-release"):
            k, _, v = line.strip().partition("=")
            osr[k] = v.strip('"')
    facts["os"] = osr.get("PRETTY_NAME", "?")
    facts["kernel"] = platform.release()
    facts["glibc"] = os.confstr("CS_GNU_LIBC_VERSION").split()[-1] if hasattr(os, "confstr") else "?"
    facts["cpus"] = os.cpu_count()
    facts["arch"] = platform.machine()

    # GPU and driver, from nvidia-smi.
    smi = shutil.which("nvidia-smi") or next(iter(glob.glob("/usr/local/nvidia/bin/nvidia-smi")), None)
    facts["gpus"] = []
    if smi:
        rc, out = sh([smi, "--query-gpu=index,name,memory.total,driver_version,compute_cap,clocks.max.sm",
                      "--format=csv,noheader"])
        if rc == 0:
            for line in out.splitlines():
                f = [x.strip() for x in line.split(",")]
                if len(f) >= 5:
                    facts["gpus"].append({"index": f[0], "name": f[1], "memory": f[2], "driver": f[3],
                                          "compute_capability": f[4], "max_sm_clock": f[5] if len(f) > 5 else ""})
        else:
            facts["nvidia_smi_error"] = out[-300:]
    facts["nvidia_smi"] = smi

    # Tools.
    tools = {}
    nvcc = shutil.which("nvcc") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))), None)
    for name, path, args, pat in [
            ("nvcc", nvcc, ["--version"], r"release ([\d.]+)"),
            ("cmake", shutil.which("cmake"), ["--version"], r"version ([\d.]+)"),
            ("ninja", shutil.which("ninja"), ["--version"], r"([\d.]+)"),
            ("g++", shutil.which("g++"), ["-dumpfullversion"], r"([\d.]+)"),
            ("compute-sanitizer", shutil.which("compute-sanitizer")
             or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer")
                                 + glob.glob("/opt/nvidia/**/compute-sanitizer", recursive=True))), None),
             ["--version"], r"Version ([\d.]+)")]:
        if not path:
            tools[name] = None
            continue
        rc, out = sh([path] + args)
        m = re.search(pat, out or "")
        tools[name] = {"path": path, "version": m.group(1) if m else out[-100:]}
    facts["tools"] = tools

    # CUDA libraries and headers.
    roots = search_roots(a.torch_python)
    found = find_files(roots)
    libs = {}
    for stem in LIBS:
        libs[stem] = [{"path": p, "version": lib_version(p, stem)} for p in sorted(found.get(stem, []))]
    facts["libs"] = libs
    facts["headers"] = {h: sorted(found.get(h, [])) for h in HEADERS}

    facts["torch"] = torch_facts(a.torch_python, bool(facts["gpus"]))

    # The directory of each library to put on LD_LIBRARY_PATH: the one torch loaded where it loaded
    # one of the right major version (known to work with this driver), else the newest.
    loaded = facts["torch"].get("loaded_libs", [])
    lib_dirs = {}
    for stem, major in LIBS.items():
        cands = [c for c in libs[stem] if vtuple(c["version"])[0] == major]
        pick = None
        for c in cands:
            if any(os.path.realpath(c["path"]) == os.path.realpath(l) for l in loaded):
                pick = c
        if pick is None and cands:
            pick = max(cands, key=lambda c: vtuple(c["version"]))
        if pick:
            lib_dirs[stem] = {"dir": os.path.dirname(pick["path"]), "version": pick["version"],
                              "path": pick["path"]}
    facts["lib_dirs"] = lib_dirs

    # The bundle's built-against versions. cuDNN guarantees only that a build against 9.x runs on
    # 9.y with y >= x (its "API compatibility" page); cuBLASLt 13.1 may use symbols 13.0 lacks.
    notes, ok = [], True
    if a.manifest and os.path.exists(a.manifest):
        man = json.load(open(a.manifest))
        facts["manifest"] = {k: man.get(k) for k in ("commit", "nvcc", "cudnn", "cublaslt", "glibc_needed",
                                                     "glibcxx_needed", "packed_at")}
        for stem, key in (("libcudnn", "cudnn"), ("libcublasLt", "cublaslt")):
            have = lib_dirs.get(stem, {}).get("version")
            if not have:
                ok = False
                notes.append(f"no {stem} of the needed major version found")
            elif vtuple(have)[:2] < vtuple(man.get(key))[:2]:  # patch releases are interchangeable
                ok = False
                notes.append(f"{stem} {have} here is older than the {man.get(key)} the bundle was built against")
        if vtuple(facts["glibc"]) < vtuple(man.get("glibc_needed")):
            ok = False
            notes.append(f"glibc {facts['glibc']} here, the bundle needs {man.get('glibc_needed')}")
    facts["bundle_versions_ok"] = ok
    facts["version_notes"] = notes

    gpu = facts["gpus"][0] if facts["gpus"] else None
    if gpu:
        facts["device_line"] = (f"{gpu['name']} ({gpu['memory']}, sm_{gpu['compute_capability'].replace('.', '')}),"
                                f" driver {gpu['driver']}")
        facts["fallback_h200"] = "H200" in gpu["name"]
    else:
        why = "nvidia-smi not found" if not smi else facts.get("nvidia_smi_error", "nvidia-smi lists no GPU")
        tc = facts["torch"]
        why += f"; torch.cuda.is_available() is {tc.get('cuda_available')}" if "torch" in tc else ""
        facts["device_line"] = f"no GPU: {why}"
        facts["fallback_h200"] = False
    json.dump(facts, open(a.json_out, "w"), indent=1)

    # The readable report.
    print(f"device:   {facts['device_line']}")
    print(f"system:   {facts['os']}, kernel {facts['kernel']}, glibc {facts['glibc']}, {facts['cpus']} CPUs")
    for k, v in tools.items():
        print(f"tool:     {k}: {v['version'] + ' at ' + v['path'] if v else 'not found'}")
    tc = facts["torch"]
    print(f"torch:    {tc.get('torch', '-')} (CUDA {tc.get('cuda')}, cuDNN {tc.get('cudnn')}, python "
          f"{tc.get('python', '?')} at {tc.get('executable', a.torch_python)})" + (f" {tc['error']}" if "error" in tc else ""))
    for stem, cands in libs.items():
        for c in cands:
            mark = " <- used" if lib_dirs.get(stem, {}).get("path") == c["path"] else ""
            print(f"lib:      {stem} {c['version']}: {c['path']}{mark}")
        if not cands:
            print(f"lib:      {stem}: not found")
    for h, paths in facts["headers"].items():
        print(f"header:   {h}: {', '.join(paths) if paths else 'not found'}")
    for l in loaded:
        print(f"torch loads: {l}")
    if a.manifest:
        print("bundle:   " + ("runtime libraries at least as new as built against" if ok else "; ".join(notes)))


if __name__ == "__main__":
    main()
