"""Build named C++/CUDA extensions of an NVIDIA apex checkout, and only those, with apex's own
``setup.py`` (its sources and compiler flags at that commit): ``python apex_ext.py SOURCE TARGET
NAME...`` compiles the extensions named into the directory TARGET (the environment's
site-packages), for the GPU of this machine only.

``setuptools.setup`` is wrapped before apex's ``setup.py`` runs, so that of the ``ext_modules``
it declares (with ``APEX_CPP_EXT=1 APEX_CUDA_EXT=1``: every core extension, ten minutes and more
for every architecture) only the named ones are built; a name apex does not declare stops the
build. ``TORCH_CUDA_ARCH_LIST`` is the device's compute capability
(``torch.cuda.get_device_capability``) unless set, and ``MAX_JOBS`` the machine's cores.

Standard library plus the torch and setuptools of the interpreter running it (no project
import: ``launchers.config.gpu.build_needed`` runs it as a script).
"""

import os
import runpy
import sys


def arch_list():
    """``9.0`` for an H100: the capability of device 0, or the environment's list."""
    given = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if given:
        return given
    import torch  # the interpreter's own (heavy; only here)

    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def main(argv):
    """Build the extensions ``argv[3:]`` of the apex checkout ``argv[1]`` into ``argv[2]``."""
    if len(argv) < 4:
        sys.stderr.write("usage: apex_ext.py SOURCE TARGET NAME...\n")
        return 2
    source, target, wanted = os.path.abspath(argv[1]), os.path.abspath(argv[2]), set(argv[3:])
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list()
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    os.environ["APEX_CPP_EXT"] = os.environ["APEX_CUDA_EXT"] = "1"
    print(f"apex_ext: building {', '.join(sorted(wanted))} for sm "
          f"{os.environ['TORCH_CUDA_ARCH_LIST']} into {target}", flush=True)  # fmt: skip
    import setuptools

    real_setup = setuptools.setup

    def only_wanted(**kwargs):
        declared = list(kwargs.get("ext_modules") or [])
        kept = [e for e in declared if e.name in wanted]
        absent = wanted - {e.name for e in kept}
        if absent:
            raise SystemExit(
                f"apex_ext: {source}/setup.py declares no extension {sorted(absent)} "
                f"(declared: {sorted(e.name for e in declared)})"
            )
        kwargs["ext_modules"] = kept
        return real_setup(**kwargs)

    setuptools.setup = only_wanted
    os.chdir(source)
    sys.path.insert(0, source)
    sys.argv = ["setup.py", "build_ext", "--build-lib", target]
    runpy.run_path(os.path.join(source, "setup.py"), run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
