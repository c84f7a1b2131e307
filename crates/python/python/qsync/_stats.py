"""The calibration file's format and the running means of its statistics.

Plain Python (no PyTorch, no imports): `qsync.calibrate` averages a PyTorch
model's statistics with it, and `scripts/calibrate.py` an ONNX model's,
run in onnxruntime (the script loads this file by path where the package is
not installed).
"""

FORMAT = "qsync-calibration"
VERSION = 1


class Running:
    """Running means of one (module or node, tensor) pair's statistics."""

    def __init__(self):
        self.sum = {}
        self.n = 0

    def add(self, s):
        for k, v in s.items():
            self.sum[k] = self.sum.get(k, 0.0) + v
        self.n += 1

    def mean(self):
        return {k: v / self.n for k, v in self.sum.items()} if self.n else None
