"""The `qsyncc` console command of the `qsync` wheel: the compiler's command
line, run in process from the package's native module (the same code as
the `qsyncc` binary built by `cargo install --path crates/qsyncc`).

It lives outside the `qsync` package so that it starts without importing
`qsync`'s training half (PyTorch): it loads `qsync._native` by file.
"""

import importlib.machinery
import importlib.util
import os
import signal
import sys


def _native():
    mod = sys.modules.get("qsync._native")
    if mod is not None:
        return mod
    spec = importlib.util.find_spec("qsync")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("qsyncc: the qsync package is not installed")
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_native" + suffix)
            if os.path.exists(path):
                ext = importlib.util.spec_from_file_location("qsync._native", path)
                mod = importlib.util.module_from_spec(ext)
                ext.loader.exec_module(mod)
                return mod
    raise SystemExit(f"qsyncc: no native module in {list(spec.submodule_search_locations)}")


def main():
    """Runs `qsyncc` with this process's arguments and exits with its status."""
    native = _native()
    # Ctrl-C ends the command as it ends the binary (the compiler does not
    # return to the interpreter to see Python's KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(native.qsyncc_main(sys.argv))
