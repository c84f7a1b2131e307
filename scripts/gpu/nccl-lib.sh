#!/usr/bin/env bash
# Exposes NCCL to the runtime's CUDA bindings, which open only unversioned
# (or .so.1, .so.9-.13) names while the PyPI wheel ships libnccl.so.2:
#   scripts/gpu/nccl-lib.sh DEST   ->  DEST/libnccl.so (a link), prints "DEST:LIBDIR"
# for LD_LIBRARY_PATH (set before the process starts: the loader reads it
# once). Searched: $QSYNC_NCCL_LIB_DIR, the wheel's folder (nvidia.nccl, or
# any nvidia/*/lib beside PyTorch), the system's folders. Exit 1 when none.
set -euo pipefail
dest=$1
libdir=${QSYNC_NCCL_LIB_DIR:-}
if [ -z "$libdir" ]; then
  libdir=$(${PYTHON:-python3} - <<'PY' 2>/dev/null || true
import glob, os
dirs = []
try:
    import nvidia.nccl as m
    dirs += [os.path.join(p, "lib") for p in m.__path__]
except Exception:
    pass
try:
    import torch
    site = os.path.dirname(os.path.dirname(torch.__file__))
    dirs += sorted(glob.glob(os.path.join(site, "nvidia", "**", "lib"), recursive=True))
except Exception:
    pass
for d in dirs:
    if glob.glob(os.path.join(d, "libnccl.so*")):
        print(d)
        break
PY
)
fi
if [ -z "$libdir" ]; then
  for d in /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/lib64; do
    if ls "$d"/libnccl.so* > /dev/null 2>&1; then libdir=$d; break; fi
  done
fi
[ -n "$libdir" ] || { echo "no libnccl.so* found (set QSYNC_NCCL_LIB_DIR)" >&2; exit 1; }
so=$(ls "$libdir"/libnccl.so "$libdir"/libnccl.so.2 "$libdir"/libnccl.so.* 2>/dev/null | head -1 || true)
mkdir -p "$dest"
ln -sf "$so" "$dest/libnccl.so"
echo "$(cd "$dest" && pwd):$libdir"
