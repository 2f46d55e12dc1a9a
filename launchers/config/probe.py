"""What one node has, as the run will see it: printed as one JSON line for ``doctor.check``.

This file is sent as the source of ``<python> -c`` to every node (through pdsh/ssh, or inside a
lab node's namespace), so it uses the standard library only and runs on any Python 3.8+: the
interpreter at the run's path may be another one on a broken node. Its one argument is a JSON
request; its output is ``MDS-DOCTOR {json}``. It reads and never writes.

Fast on CPU (no torch import: versions come from the installed distributions' metadata, which is
what pip reports); on CUDA it imports torch, upstream's ``CUDA_HOME`` source
(``torch.utils.cpp_extension``) and apex's modules for real, since an extension built against
another torch fails only when imported.
"""

from __future__ import annotations

import ast
import glob
import importlib
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys

MARKER = "MDS-DOCTOR "
"""Prefix of the probe's output line (launcher prefixes and login banners are ignored)."""

PACKAGES = ("torch", "deepspeed", "transformers")
"""Distributions compared with the launching node."""

APEX_MODULES = (
    "apex.normalization",
    "apex.optimizers",
    "apex.multi_tensor_apply",
    "amp_C",
    "fused_layer_norm_cuda",
    "fused_weight_gradient_mlp_cuda",
)
"""apex modules upstream imports on CUDA (``launchers.config.gpu.UPSTREAM_NEEDS`` says where)."""

CUDA_HEADERS = ("cuda_runtime_api.h", "cusparse.h", "cublas_v2.h", "cublasLt.h", "cusolverDn.h")
"""Headers torch's ``ATen/cuda/CUDAContextLight.h`` includes: every extension that includes
``ATen/cuda/CUDAContext.h`` (upstream's fused softmax kernels, apex's) compiles only with them."""


def _headers(cuda_home):
    """Which of :data:`CUDA_HEADERS` no include directory of the compilers holds.

    torch's extensions pass ``-I<CUDA_HOME>/include``; gcc (and nvcc through it) also search
    ``CPATH`` and ``CPLUS_INCLUDE_PATH``. Also where the torch wheel's own NVIDIA packages keep
    them (``site-packages/nvidia/*/include``), to say so in the fix.
    """
    dirs = [os.path.join(cuda_home, "include")]
    for variable in ("CPATH", "CPLUS_INCLUDE_PATH"):
        dirs += [d for d in os.environ.get(variable, "").split(os.pathsep) if d]
    missing = [h for h in CUDA_HEADERS if not any(os.path.isfile(os.path.join(d, h)) for d in dirs)]
    wheel = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for name in sorted(os.listdir(root)):
            include = os.path.join(root, name, "include")
            if os.path.isfile(os.path.join(include, "cusparse.h")):
                wheel.append(include)
    return {"missing": missing, "searched": dirs, "wheel_include": wheel}


def _version(name):
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # Python < 3.8
        return None
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def torch_cuda_build():
    """``torch.version.cuda`` read from torch/version.py without importing torch (slow)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "version.py")
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if getattr(target, "id", None) == "cuda" and node.value is not None:
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def _upstream(path):
    out = {"path": path, "present": os.path.isfile(os.path.join(path, "pretrain_gpt.py"))}
    if not out["present"]:
        out["exists"] = os.path.isdir(path)
        return out
    try:
        proc = subprocess.run(
            ["git", "-C", path, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        out["commit"] = proc.stdout.strip() if proc.returncode == 0 else None
        if proc.returncode != 0:
            out["error"] = proc.stderr.strip()[-300:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        head = os.path.join(path, ".git", "HEAD")
        try:  # no git on the node: a detached checkout's HEAD holds the commit
            with open(head, encoding="utf-8") as f:
                out["commit"] = f.read().strip()
        except OSError:
            out["commit"] = None
            out["error"] = f"git: {exc}"
    return out


def _files(paths):
    out = {}
    for label, path in paths.items():
        try:
            out[label] = {"path": path, "size": os.path.getsize(path), "file": os.path.isfile(path)}
        except OSError as exc:
            out[label] = {"path": path, "size": None, "file": False, "error": exc.strerror}
    return out


def _disk(path):
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    usage = shutil.disk_usage(probe)
    return {"path": path, "checked": probe, "free_bytes": usage.free,
            "writable": os.access(probe, os.W_OK)}  # fmt: skip


def _interfaces():
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return []


def _import(name):
    try:
        importlib.import_module(name)
        return None
    except BaseException as exc:  # an extension of another torch raises ImportError or worse
        return f"{type(exc).__name__}: {exc}"[:300]


def _cuda():
    """Accelerator, apex and nvcc as upstream finds them (imports torch)."""
    out = {}
    try:
        import torch  # heavy, and only on CUDA: a broken torch is a finding, not a crash
    except BaseException as exc:
        return {"error": f"import torch: {type(exc).__name__}: {exc}"}
    out["torch_version"] = torch.__version__
    try:
        out["available"] = bool(torch.cuda.is_available())
        out["count"] = torch.cuda.device_count() if out["available"] else 0
        if out["count"]:
            out["name"] = torch.cuda.get_device_name(0)
    except BaseException as exc:
        out["available"], out["count"] = False, 0
        out["error"] = f"{type(exc).__name__}: {exc}"
    try:
        from torch.utils.cpp_extension import CUDA_HOME  # what upstream's fused_kernels uses
    except BaseException as exc:
        CUDA_HOME = None
        out["cuda_home_error"] = str(exc)[:300]
    out["cuda_home"] = CUDA_HOME
    if CUDA_HOME:
        nvcc = os.path.join(CUDA_HOME, "bin", "nvcc")
        out["nvcc"] = nvcc
        try:
            proc = subprocess.run([nvcc, "-V"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=60)  # fmt: skip
            out["nvcc_output"] = proc.stdout[-400:]
            out["nvcc_rc"] = proc.returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            out["nvcc_output"], out["nvcc_rc"] = str(exc), None
        out["headers"] = _headers(CUDA_HOME)
    out["other_homes"] = {}  # toolkits elsewhere, for the fix when CUDA_HOME lacks something
    for home in sorted(glob.glob("/usr/local/cuda*") + glob.glob("/opt/cuda*")):
        if os.path.isfile(os.path.join(home, "bin", "nvcc")) and home != CUDA_HOME:
            out["other_homes"][home] = _headers(home)["missing"]
    apex = {}
    for name in APEX_MODULES:
        apex[name] = _import(name)
    spec = importlib.util.find_spec("apex")
    out["apex_origin"] = spec.origin if spec is not None else None
    out["apex"] = apex
    return out


def probe(request):
    """The node's facts for ``request`` (a dict; see ``launchers.doctor.check.ProbeRequest``)."""
    device = request.get("device", "cpu")
    python = sys.executable
    out = {
        "hostname": socket.gethostname(),
        "python": {"executable": python, "version": platform.python_version()},
        "packages": {name: _version(name) for name in PACKAGES},
        "torch_cuda_build": torch_cuda_build(),
        "launcher_script": None,
        "upstream": _upstream(request["upstream_dir"]),
        "files": _files(request.get("files", {})),
        "cpus": os.cpu_count(),
        "interfaces": _interfaces(),
        "disk": _disk(request.get("logs", ".")),
    }
    script = request.get("deepspeed")
    if script:
        out["launcher_script"] = {"path": script, "exists": os.path.isfile(script)}
    if device == "cuda":
        out["cuda"] = _cuda()
    return out


def command(python, request):
    """argv running this probe with ``python`` for ``request`` (the source goes in ``-c``)."""
    with open(__file__, encoding="utf-8") as f:
        source = f.read()
    return [python, "-c", source, json.dumps(request, sort_keys=True)]


def parse_output(text):
    """The facts in a probe's output (the last ``MDS-DOCTOR`` line), or None."""
    found = None
    for line in text.splitlines():
        at = line.find(MARKER)
        if at >= 0:
            try:
                found = json.loads(line[at + len(MARKER) :])
            except ValueError:
                continue
    return found


def main(argv):
    """Print ``MDS-DOCTOR <json>`` for the JSON request in ``argv[1]``."""
    request = json.loads(argv[1]) if len(argv) > 1 else {}
    try:
        facts = probe(request)
    except BaseException as exc:  # say it rather than die silently: the doctor shows it
        facts = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(MARKER + json.dumps(facts, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
