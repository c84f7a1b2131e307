"""Mutation fuzzing of the package's plan directory reader.

    python fuzz_plan_dir.py PLAN_DIR WORK_DIR SECONDS [SEED]

Starting from a plan directory qsyncc wrote, each round mutates its
manifest.json or a device's plan.json — bytes flipped, inserted or cut,
the file truncated, or a JSON value replaced by another type, a huge or
negative number, a deep nesting, a path out of the folder — and reads the
result as a user's script does (`Plan.load`, `targets`, `device_count`,
`nodes`, `model_name`, the batch and synchronization settings, and each
device's batch, gradient weight and `device_plan`). Every failure must be
a `PlanError`; anything else (KeyError, TypeError, RecursionError, a hang)
is a finding, printed with the input that caused it. Deterministic for a
seed. Prints one JSON summary line: rounds, findings, seconds.
"""
import json
import os
import random
import shutil
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import source_plan  # noqa: E402

plan_mod = source_plan.load()

ODD = [None, True, -1, 0, 2**63, -2**63, 1e308, float("nan"), "", "x" * 1000, [], {}, [1, "a"],
       {"count": "8"}, "../../etc/passwd", "/etc/passwd", "t4/../../x"]


def mutate_value(rng, v, depth=0):
    if depth > 6 or rng.random() < 0.3:
        if rng.random() < 0.8:
            return rng.choice(ODD)
        nest = []
        for _ in range(rng.choice([10, 100, 500])):
            nest = [nest]
        return nest
    if isinstance(v, dict) and v:
        k = rng.choice(sorted(v))
        if rng.random() < 0.15:
            v = dict(v)
            del v[k]
            return v
        v = dict(v)
        v[k] = mutate_value(rng, v[k], depth + 1)
        return v
    if isinstance(v, list) and v:
        v = list(v)
        i = rng.randrange(len(v))
        v[i] = mutate_value(rng, v[i], depth + 1)
        return v
    return rng.choice(ODD)


def mutate_bytes(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        if not b:
            break
        i = rng.randrange(len(b))
        if op < 0.4:
            b[i] = rng.randrange(256)
        elif op < 0.7:
            b.insert(i, rng.randrange(256))
        elif op < 0.9:
            del b[i]
        else:
            del b[rng.randrange(len(b)):]
    return bytes(b)


def read_all(d):
    p = plan_mod.Plan.load(d)
    _ = (p.targets, p.device_count, p.nodes, p.model_name, p.model_sha256, p.global_batch, p.sync_scheme,
         p.sync_group, p.cluster_text(), p.device_for_rank(0))
    for t in p.targets:
        p.local_batch(t["device"])
        p.gradient_weight(t["device"])
        p.device_plan(t["device"])


def main():
    src, work, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    rng = random.Random(seed)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    base = os.path.join(work, "base")
    shutil.copytree(src, base)
    manifest = json.load(open(os.path.join(base, "manifest.json")))
    files = ["manifest.json"] + sorted(
        f for d in manifest.get("devices", {}).values() for f in d.get("files", {}).values() if f.endswith(".json"))
    texts = {f: open(os.path.join(base, f), "rb").read() for f in files}
    findings, rounds, t0 = {}, 0, time.time()
    d = os.path.join(work, "case")
    while time.time() - t0 < seconds:
        rounds += 1
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        f = rng.choice(files)
        r = rng.random()
        if r < 0.05:
            k = rng.choice([1000, 100000])
            data = b"[" * k + b"]" * k
        elif r < 0.5:
            data = mutate_bytes(rng, texts[f])
        else:
            data = json.dumps(mutate_value(rng, json.loads(texts[f]))).encode()
        with open(os.path.join(d, f), "wb") as out:
            out.write(data)
        try:
            read_all(d)
        except plan_mod.PlanError:
            pass
        except Exception as e:  # noqa: BLE001 -- every other exception is a finding
            where = traceback.extract_tb(e.__traceback__)[-1]
            key = (type(e).__name__, where.lineno)
            if key not in findings:
                findings[key] = {"error": f"{type(e).__name__}: {e}"[:300], "line": where.lineno, "file": f,
                                 "input": data[:400].decode("utf-8", "replace")}
                print(json.dumps({"finding": findings[key]}), flush=True)
    print(json.dumps({"rounds": rounds, "findings": len(findings), "seconds": round(time.time() - t0, 1)}))
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
