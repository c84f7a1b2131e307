"""The source tree's `qsync/plan.py`, loaded without the package's native
extension: as a submodule of a stand-in package whose path is the source
`qsync/` folder, so its relative imports (`.errors`) resolve there too.
The plan-directory checks test the reader as written, not an installed
wheel."""
import importlib.util
import os
import sys
import types

_PKG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "qsync")


def load(package="qsync_source"):
    """The module `plan` of `package` (created on first use)."""
    if package not in sys.modules:
        pkg = types.ModuleType(package)
        pkg.__path__ = [_PKG_DIR]
        sys.modules[package] = pkg
    name = f"{package}.plan"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(_PKG_DIR, "plan.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
