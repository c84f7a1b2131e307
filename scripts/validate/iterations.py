#!/usr/bin/env python3
"""Whole iterations on real links against the model (docs/validation.md, table 3).

    python3 scripts/validate/iterations.py --qsyncc target/release/qsyncc --out target/validate \
        [--rates 200mbit,10gbit] [--models transformer,resnet18]

For each link rate, a 2-node emulated cluster (scripts/netcluster.sh), 2
ranks a node (`--ranks-per-node`) pinned to the node's own cores, gloo
bound to each node's shaped interface. For each model, `qsyncc plan --sync auto` on a cluster
file of the same links names a scheme and lists every scheme it weighed;
then `examples/train_ddp.py bench` under torchrun (one torchrun per node
namespace) times the backward pass under the qsync hook of each of those
schemes, one job a hook as a user trains with one, round-robin with DDP's
own all-reduce and the backward with synchronization switched off
(`no_sync`, forward included) in the same job. (A single job that kept
every hook's model alive slowed each hook by its place in the job: ResNet-18's
nbit-8 at 10 Gbit/s took 0.50 s first and 0.76 s last of twelve, its
gloo threads 0.057 and 0.108 CPU seconds for the same bytes.) DDP's own
row is the median over the jobs. What the synchronization adds —
the backward with it minus the backward without — is the claim under test:
`qsyncc simulate` of the same model (exported to ONNX by train_ddp.py) on
a cluster file of the same links predicts the iteration with the scheme
and without any synchronization (fp32 with the network taken as free is
not expressible, so: iteration minus the compute stream), and the predicted
exposed synchronization is compared with the measured one. Then `qsyncc
plan --sync auto` on the same cluster file names a scheme; the table says
whether it is the one that measured fastest among all it weighed, each
hook's backward taken as its ratio to DDP's all-reduce in the same rounds
(hooks timed in different jobs met different moments of the machine).

The compute itself is not the claim here (table 2 checks it): the cpu
device file is one core of this CPU as `scripts/cpu/device.py` measures
it on one thread, and the cluster file's `host_cores_per_node` has a
node's two ranks share one core (each computes at half its speed). The host
is described as for table 1 (kernels on one core, medians of three
measurements), except the transport: the hooks move their bytes through
gloo (qsync's TorchTransport), whose cost per byte and per exchange is
measured with that transport itself (`gloo_transport_cost`), not taken
from Open MPI's.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NETCLUSTER = os.path.join(ROOT, "scripts", "netcluster.sh")
sys.path.insert(0, HERE)
from sync import (PROBE_RATE, cluster_toml, fit_messages, host_kernels, measure_host, measure_links,  # noqa: E402
                  median, probe_cluster_up, sh)



def torchrun_nodes(a, ns, addr, k, cores, torchrun, what, script):
    """`script` under torchrun on every emulated node (`k` ranks a node,
    pinned to the node's cores, gloo bound to its shaped interface); the
    (stdout, stderr) of each node's torchrun."""
    procs = []
    for i in range(len(ns)):
        env = {**os.environ, "GLOO_SOCKET_IFNAME": f"{a.prefix}n{i}", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        pin = ["taskset", "-c", f"{i * cores}-{i * cores + cores - 1}"]
        keep = ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "PATH", "HOME")
        cmd = ["ip", "netns", "exec", ns[i], *pin, "env", *[f"{k_}={v}" for k_, v in env.items() if k_ in keep],
               torchrun, "--nnodes", str(len(ns)), "--node-rank", str(i), "--nproc-per-node", str(k),
               "--master-addr", addr[0], "--master-port", "29517", *script]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=1800) for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"validate: {what} failed:\n" + "\n".join(o[1][-3000:] for o in outs))
    return outs


def json_lines(outs):
    """The JSON objects node 0's torchrun printed, one a line (`outs`:
    `torchrun_nodes`' result)."""
    return [json.loads(line) for line in outs[0][0].splitlines() if line.startswith("{")]


def nodes_up(a, nodes, rate):
    """`nodes` emulated nodes at `rate` (`a.prefix`, `a.subnet`), any left
    by an earlier run taken down first; the caller takes them down. Their
    namespaces and addresses."""
    ns = [f"{a.prefix}{i}" for i in range(nodes)]
    addr = [f"{a.subnet}.{i + 2}" for i in range(nodes)]
    subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
    sh(["bash", NETCLUSTER, "up", "--nodes", str(nodes), "--rate", rate, "--prefix", a.prefix, "--subnet", a.subnet])
    return ns, addr


def gloo_transport_cost(a, nodes, k, cores, torchrun, host_file):
    """The hook's own transport, measured as `sync.link_tcp_cost` measures
    Open MPI's: the ranks' all-to-all through qsync's TorchTransport (gloo)
    across the emulated nodes on a 40 Gbit/s link, 16 MiB a rank in 1
    exchange and 1 MiB in 32 (`gloo_probe.py`), fitted per byte and per
    call with the node's ranks sharing its cores; gloo's own all-reduce (DDP's
    fp32 ring) at 16 MiB and 64 KiB, fitted per byte and per step; its
    all-gather of 8 bytes a rank, per step; and the
    all-to-alls again beside a compute thread in every rank. Writes a
    copy of `host_file` with these `tcp_r` and `message_s` (what the hook
    path is priced with), `ring_tcp_r` and `ring_step_s` (what DDP's own
    all-reduce is priced with), `gather_step_s` (a step of the transport's
    ring all-gather), `busy_round_s` (what an exchange round
    waits while the backward pass computes) and `bucket_r` (what DDP itself
    does on the training thread around a hook, per element) and returns
    its path. Also
    records, in OUT/gloo-stalls.json, how tiny calls through the same
    transport spread when made one at a time (`gloo_stalls.py`), which the
    per-round figures average over."""
    rate = PROBE_RATE
    ns, addr = probe_cluster_up(a, nodes)
    try:
        outs = torchrun_nodes(a, ns, addr, k, cores, torchrun, "the gloo transport probe",
                              [os.path.join(HERE, "gloo_probe.py"), "--mib", "16", "--many", "32"])
        # Tiny calls one at a time, for the record: the spread that the
        # per-round figures below average over (gloo_stalls.py).
        stalls = torchrun_nodes(a, ns, addr, k, cores, torchrun, "the gloo stall probe",
                                [os.path.join(HERE, "gloo_stalls.py")])
    finally:
        subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
    r = json_lines(outs)[0]
    p, share, many = r["ranks"], k / cores, 32
    recv = r["received_bytes_per_rank"]
    # Per byte and per message from the regimes the hook runs in: a bucket
    # goes in one exchange a phase, large (16 MiB in 1 exchange) or small
    # (1 MiB in 32: where the messages' own cost shows). The 32 exchanges of
    # 16 MiB are for the record: through gloo each costs less beyond its
    # bytes than a small exchange does (its wait overlaps the bytes). A fit
    # from them and the small ones priced a byte at a sixth of what one
    # large exchange measures; one from them and the one exchange (until
    # 2026-12-01) priced a small exchange at nothing on a slow day.
    msg, byte = fit_messages(r["one_s"], recv, p - 1, r["tiny_s"], r["tiny_received_bytes_per_rank"], many * (p - 1))
    hk = json.load(open(host_file))
    hk["kernels"]["tcp_r"], hk["kernels"]["message_s"] = byte / share, msg / share
    hk.setdefault("sources", {})["tcp_r"] = (
        f"scripts/validate/iterations.py: the ranks' all-to-all through qsync's TorchTransport (gloo, the DDP "
        f"hook's transport) between 2 emulated nodes on a {rate} link, {k} ranks a node pinned to {cores} core(s), "
        f"16 MiB a rank in 1 exchange ({r['one_message_bytes']} B a peer) and 1 MiB in {many} "
        f"({r['tiny_message_bytes']} B a peer): {r['one_s'] * 1e3:.1f} ms and {r['tiny_s'] * 1e3:.2f} ms (16 MiB "
        f"in {many}, for the record: {r['split_s'] * 1e3:.1f} ms); fitted per byte {byte / share * 1e9:.3f} ns "
        f"and per exchange a peer {msg / share * 1e6:.1f} us of CPU time")
    hk["sources"]["message_s"] = "as tcp_r"
    # gloo's own ring (DDP's fp32 all-reduce), CPU-bound on this link:
    # T(S) = share·(2(P−1)·(ring_tcp_r·S/P + ring_step_s) + (P−1)·sum_r·S/(4P)),
    # with this host's measured sum_r; two sizes give the two unknowns
    # (the step includes the link's latency, which is tens of µs here).
    sum_r = hk["kernels"].get("sum_r") or 0.0
    big, small = r["ring_bytes"], r["ring_small_bytes"]
    def per_share(t, s):
        return t / share - (p - 1) * sum_r * s / (4 * p)
    ring_r = max(0.0, (per_share(r["ring_s"], big) - per_share(r["ring_small_s"], small))
                 / (2 * (p - 1) * (big - small) / p))
    ring_step = max(0.0, per_share(r["ring_small_s"], small) / (2 * (p - 1)) - ring_r * small / p)
    hk["kernels"]["ring_tcp_r"], hk["kernels"]["ring_step_s"] = ring_r, ring_step
    hk["sources"]["ring_tcp_r"] = (
        f"scripts/validate/iterations.py: gloo's own all-reduce (torch.distributed.all_reduce, DDP's fp32 "
        f"synchronization) of {big} B and of {small} B of f32 on the same ranks and link: "
        f"{r['ring_s'] * 1e3:.2f} ms and {r['ring_small_s'] * 1e3:.3f} ms; fitted as a ring with this host's "
        f"sum_r, per byte {ring_r * 1e9:.3f} ns and per step {ring_step * 1e6:.1f} us of CPU time")
    hk["sources"]["ring_step_s"] = "as ring_tcp_r"
    # gloo's ring all-gather (the hook's last phase): P−1 steps of a few
    # bytes, each waiting for the one before; per step, as CPU time at one
    # rank a core (the model multiplies by the ranks sharing a core).
    gather_step = r["gather_small_s"] / (p - 1) / share
    hk["kernels"]["gather_step_s"] = gather_step
    hk["sources"]["gather_step_s"] = (
        f"scripts/validate/iterations.py: the transport's all-gather (gloo's ring) of {r['gather_small_bytes']} B a "
        f"rank on the same ranks and link, {r['gather_small_s'] * 1e3:.2f} ms: {p - 1} steps, each "
        f"{gather_step * 1e6:.0f} us of CPU time with the node's {k} ranks sharing {cores} core(s) "
        f"(an all-to-all's message: {msg / share * 1e6:.0f} us)")
    # The all-to-alls beside a compute thread in every rank: the work runs
    # at half its share of the cores (a compute thread beside each
    # synchronizing thread), and what every further exchange round adds
    # beyond that is the time its threads wait to be scheduled.
    busy_round = max(0.0, ((r["busy_split_s"] - r["busy_one_s"]) - 2.0 * (r["split_s"] - r["one_s"])) / (many - 1))
    hk["kernels"]["busy_round_s"] = busy_round
    hk["sources"]["busy_round_s"] = (
        f"scripts/validate/iterations.py: the same all-to-alls while every rank runs a thread of "
        f"{r['compute_size']}x{r['compute_size']} matrix products: {r['busy_one_s'] * 1e3:.1f} ms in 1 exchange, "
        f"{r['busy_split_s'] * 1e3:.1f} ms in {many}; each further exchange beyond twice its time alone (the "
        f"cores shared with the compute thread) waits {busy_round * 1e3:.2f} ms")
    # DDP's own work on the training thread around a hook (its copies of
    # the gradients into their buckets and back, its bookkeeping), as CPU
    # time at one rank a core, measured through DDP itself rather than as
    # two plain copies: per element (`bucket_r`, at every size of the
    # ladder alike: DDP's buckets are 25 MiB whatever the model) and per
    # parameter tensor (`bucket_tensor_s`), from a stack of large layers
    # (most of it per element) and one of many small ones (most of it per
    # tensor): T = elements·bucket_r + tensors·bucket_tensor_s, as
    # fit_messages solves it.
    big_d = r["ddp_hook_backward_s"] - r["ddp_no_sync_backward_s"]
    small_d = r["ddp_small_hook_backward_s"] - r["ddp_small_no_sync_backward_s"]
    per_tensor, ddp_r = fit_messages(big_d / share, r["ddp_elements"], r["ddp_tensors"],
                                     small_d / share, r["ddp_small_elements"], r["ddp_small_tensors"])
    copies_r = hk["kernels"].get("bucket_r")
    hk["kernels"]["bucket_r"], hk["kernels"]["bucket_tensor_s"] = ddp_r, per_tensor
    for row in hk["kernels"].get("by_size") or []:
        row["bucket"] = ddp_r
    hk["sources"]["bucket_r"] = (
        f"scripts/validate/iterations.py: DDP's backward of {r['ddp_elements']} elements in {r['ddp_tensors']} "
        f"parameters (linear layers) under a comm hook that hands every bucket straight back, "
        f"{r['ddp_hook_backward_s'] * 1e3:.2f} ms, against the same backward under no_sync, "
        f"{r['ddp_no_sync_backward_s'] * 1e3:.2f} ms; of {r['ddp_small_elements']} elements in "
        f"{r['ddp_small_tensors']} parameters, {r['ddp_small_hook_backward_s'] * 1e3:.2f} ms against "
        f"{r['ddp_small_no_sync_backward_s'] * 1e3:.2f} ms, on the same ranks: {ddp_r * 1e9:.3f} ns an element and "
        f"{per_tensor * 1e6:.2f} us a parameter tensor of CPU time with the node's {k} ranks sharing {cores} core(s), "
        f"at every size (host-kernels' two plain copies: {(copies_r or 0.0) * 1e9:.3f} ns)")
    hk["sources"]["bucket_tensor_s"] = "as bucket_r"
    # What qsync's hook adds to a bucket beyond the runtime's call, as
    # wall time on these ranks and cores (`hook_call_s`).
    hook = max(0.0, r["hook_overhead_s"])
    hk["kernels"]["hook_call_s"] = hook
    hk["sources"]["hook_call_s"] = (
        f"scripts/validate/iterations.py: a backward of one linear layer ({r['hook_elements']} parameters, one "
        f"bucket) under qsync.comm_hook({r['hook_scheme']!r}) less the runtime's call, against the same under a hook "
        f"that hands the bucket straight back, on the same ranks: {r['hook_overhead_s'] * 1e6:.0f} us a bucket "
        f"(the slowest rank's difference of medians)")
    # What interleaving with the backward pass on a core adds to the
    # synchronization's CPU work and the backward's (`interleave_r`).
    hk["kernels"]["interleave_r"] = max(0.0, r["interleave_r"])
    i0 = r["interleave_rank0"]
    hk["sources"]["interleave_r"] = (
        f"scripts/validate/gloo_probe.py: the runtime's {r['interleave_scheme']} all-reduce of "
        f"{r['interleave_elements']} elements, {r['interleave_calls']} calls, beside a thread of forward and backward "
        f"passes of 4 linear layers of 1024², against each alone, on the same ranks and cores: the CPU both added, "
        f"per CPU second of the synchronization alone, {r['interleave_r']:.3f} (mean over ranks of each rank's median; "
        f"rank 0: {i0['syncs_alone_s'] * 1e3:.0f} ms of calls alone, {i0['passes']:.0f} passes of "
        f"{i0['pass_alone_s'] * 1e3:.1f} ms alone, {i0['beside_s'] * 1e3:.0f} ms of CPU both together)")
    spread = json_lines(stalls)[0]
    json.dump(spread, open(os.path.join(a.out, "gloo-stalls.json"), "w"), indent=1)
    print("validate: tiny calls one at a time (median / mean / calls over 1 ms of " + str(spread["socket_ping_pong"]["calls"])
          + "): " + "; ".join(f"{op} {v['median_us']:.0f} / {v['mean_us']:.0f} us / {v['over_1ms']}"
                              for op, v in spread.items() if isinstance(v, dict)), file=sys.stderr, flush=True)
    out = os.path.join(a.out, "host-kernels-gloo.json")
    json.dump(hk, open(out, "w"), indent=1)
    print(f"validate: the hook's transport (gloo) costs {byte / share * 1e9:.3f} ns a byte and "
          f"{msg / share * 1e6:.1f} us a message ({r['one_s'] * 1e3:.1f} ms for 16 MiB in 1 exchange, "
          f"{r['tiny_s'] * 1e3:.2f} ms for 1 MiB in {many}; 16 MiB in {many}: {r['split_s'] * 1e3:.1f} ms); gloo's own ring {ring_r * 1e9:.3f} ns a byte and "
          f"{ring_step * 1e6:.1f} us a step; its all-gather {gather_step * 1e6:.0f} us a step; beside compute an exchange round waits {busy_round * 1e3:.2f} ms more; "
          f"DDP's buckets {ddp_r * 1e9:.3f} ns an element and {per_tensor * 1e6:.2f} us a parameter tensor; "
          f"interleaving with the backward adds {r['interleave_r']:.3f} of the synchronization's CPU",
          file=sys.stderr, flush=True)
    return out


def predict(a, onnx, cluster, cpu, host_file, hook):
    """What the model says of `hook` ("ddp": DDP's own all-reduce) on `onnx`
    over `cluster`: the exposed synchronization and the compute stream (s),
    and for a compressed scheme where it puts one synchronization of the
    whole gradient."""
    scheme = "fp32" if hook == "ddp" else hook
    p = json.loads(sh([a.qsyncc, "simulate", onnx, "--cluster", cluster, "--device-file", cpu,
                       "--host-kernels", host_file, "--batch", str(a.batch), "--sync", scheme, "--json"]).stdout)
    d = p["devices"]["cpu"]
    out = {"exposed_s": (p["iteration_ms"] - d["compute_ms"]) / 1e3, "compute_s": d["compute_ms"] / 1e3}
    if scheme != "fp32":
        # Where the model puts one synchronization of the whole gradient,
        # set against the hook's measured phases.
        g = json.loads(sh([a.qsyncc, "simulate", "--gradient", str(p["allreduce_bytes"]), "--cluster", cluster,
                           "--device-file", cpu, "--host-kernels", host_file, "--sync", scheme, "--json"]).stdout)
        out["breakdown"] = g["per_type_breakdown"]["cpu"]
    return out


def set_prediction(row, p):
    """Write prediction `p` (`predict`) into measured `row`: the predicted
    exposed synchronization and backward, the error, the breakdown."""
    row["predicted_exposed_s"] = p["exposed_s"]
    row["predicted_backward_s"] = row["no_sync_backward_s"] + p["exposed_s"]
    row["error"] = row["predicted_backward_s"] / row["backward_s"] - 1
    row.pop("predicted_breakdown", None)
    if "breakdown" in p:
        row["predicted_breakdown"] = p["breakdown"]


def plan_auto(a, onnx, cluster, cpu, host_file, m, rate):
    """`qsyncc plan --sync auto` on `onnx` over `cluster`: its JSON report and
    the plan's manifest."""
    plan_dir = os.path.join(a.out, f"auto-{m}-{rate}")
    auto = json.loads(sh([a.qsyncc, onnx, "--cluster", cluster, "--device-file", cpu, "--host-kernels", host_file,
                          "--batch", str(a.batch), "--sync", "auto", "--sync-error-budget", "1", "--precisions",
                          "fp32", "--json", "-o", plan_dir]).stdout)
    return auto, json.load(open(os.path.join(plan_dir, "manifest.json")))


def repredict(a):
    """Predict the rows of `--out`/iterations.jsonl again with this `qsyncc`,
    from the files the measuring run left beside it (the cluster files, the
    cpu device, the host kernels, the models), without measuring."""
    path = os.path.join(a.out, "iterations.jsonl")
    cpu = os.path.join(a.out, "cpu.json")
    host_file = os.path.join(a.out, "host-kernels-gloo.json")
    for f in (path, cpu, host_file):
        if not os.path.exists(f):
            raise SystemExit(f"validate: --repredict needs {f}, which a measuring run of iterations.py writes")
    rows = [json.loads(l) for l in open(path) if l.strip()]
    autos = {}
    for row in rows:
        rate, m = row["rate"], row["model"]
        onnx, cluster = os.path.join(a.out, f"{m}.onnx"), os.path.join(a.out, f"iter-cluster-{rate}.toml")
        for f in (onnx, cluster):
            if not os.path.exists(f):
                raise SystemExit(f"validate: --repredict needs {f} for the {m} rows at {rate}")
        if (rate, m) not in autos:
            autos[(rate, m)] = plan_auto(a, onnx, cluster, cpu, host_file, m, rate)[0]["sync"]["scheme"]
        set_prediction(row, predict(a, onnx, cluster, cpu, host_file, row["hook"]))
        row["auto"] = autos[(rate, m)]
    with open(path + ".tmp", "w") as f:
        for row in rows:
            print(json.dumps(row), file=f)
    os.replace(path + ".tmp", path)
    print(f"validate: {len(rows)} rows of {path} predicted again", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qsyncc", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default=os.path.expanduser("~/.cache/qsync/torch-venv/bin/python"))
    ap.add_argument("--rates", default="200mbit,10gbit")
    ap.add_argument("--models", default="transformer,resnet18")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ranks-per-node", type=int, default=2,
                    help="ranks a node (1: each node's one rank on a core of its own, as on a real cluster)")
    ap.add_argument("--prefix", default="qsi")
    ap.add_argument("--subnet", default="10.88.8")
    ap.add_argument("--repredict", action="store_true",
                    help="predict the rows of OUT/iterations.jsonl again, without measuring")
    ap.add_argument("--host-only", action="store_true",
                    help="measure the host's description (the kernels, the transport, cpu.json) and stop: "
                         "what hook_paths.py predicts with")
    a = ap.parse_args()
    if a.repredict:
        return repredict(a)
    os.makedirs(a.out, exist_ok=True)
    nodes, k = 2, a.ranks_per_node
    if k < 1:
        raise SystemExit(f"validate: --ranks-per-node must be at least 1, not {k}")
    venv_bin = os.path.dirname(a.python)
    torchrun = os.path.join(venv_bin, "torchrun")
    cores = max(1, (os.cpu_count() or 1) // nodes)
    # Three measurements back to back; the model is given their medians.
    measured = [measure_host(a, nodes, k, cores, i) for i in range(3)]
    host_file = host_kernels(a, nodes, k, cores, measured, "host-kernels-iterations.json")
    # What a byte costs a node's core at PROBE_RATE, against which each
    # link's own cost is measured (the cluster files' nic_cpu_ns_per_byte).
    probe_ns = median([m["link"]["stream_ns_per_byte"] for m in measured])
    host_file = gloo_transport_cost(a, nodes, k, cores, torchrun, host_file)
    cpu = os.path.join(a.out, "cpu.json")
    # Measured afresh by every measuring run (one left by an earlier run may
    # describe other threads or another machine): the cores one rank
    # computes on, a thread (the ranks run with OMP_NUM_THREADS=1). The
    # cluster file's host_cores_per_node says how many ranks share a core.
    sh([a.python, os.path.join(ROOT, "scripts", "cpu", "device.py"), cpu, "--name", "cpu"],
       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if a.host_only:
        return
    # Each model exported to ONNX as train_ddp.py's `plan` exports it.
    onnx = {}
    export = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import train_ddp as t; "
              "m = t.make_model(sys.argv[2], 0); m.train(); "
              "torch.onnx.export(m, (t.example_input(sys.argv[2], int(sys.argv[3])),), sys.argv[4], dynamo=False, "
              "training=torch.onnx.TrainingMode.TRAINING, input_names=['x'], do_constant_folding=False)")
    for m in a.models.split(","):
        onnx[m] = os.path.join(a.out, f"{m}.onnx")
        sh([a.python, "-c", export, os.path.join(ROOT, "examples"), m, str(a.batch), onnx[m]])
    out = open(os.path.join(a.out, "iterations.jsonl"), "w")
    for rate in a.rates.split(","):
        sh(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
        sh(["bash", NETCLUSTER, "up", "--nodes", str(nodes), "--rate", rate, "--prefix", a.prefix, "--subnet", a.subnet])
        try:
            ns = [f"{a.prefix}{i}" for i in range(nodes)]
            addr = [f"{a.subnet}.{i + 2}" for i in range(nodes)]
            cluster = os.path.join(a.out, f"iter-cluster-{rate}.toml")
            with open(cluster, "w") as f:
                f.write(cluster_toml(f"netcluster-{rate}", "cpu", nodes, k, rate, measure_links(ns, addr, rate, k),
                                     cores, probe_ns))
            for m in a.models.split(","):
                auto, manifest = plan_auto(a, onnx[m], cluster, cpu, host_file, m, rate)
                weighed = [c["scheme"] for c in manifest["sync"]["considered"]]
                hooks = ["ddp"] + [h for h in weighed if h != "fp32"]
                # One job a hook, as a user runs one: a job that keeps
                # every hook's model alive at once slows each hook by where
                # it runs in the job (see the module doc). Each job also
                # times DDP's all-reduce and the unsynchronized backward, in
                # the same rounds as its hook.
                measured, jobs = {}, []
                for h in [x for x in hooks if x != "ddp"] or ["ddp"]:
                    outs = torchrun_nodes(a, ns, addr, k, cores, torchrun, f"bench {m} {h} at {rate}",
                                          [os.path.join(ROOT, "examples", "train_ddp.py"), "bench", "--model", m,
                                           "--hooks", h, "--batch", str(a.batch), "--reps", str(a.reps)])
                    got = {r["hook"]: r for r in json_lines(outs)}
                    got[h]["ddp_rounds_s"] = got["ddp"]["rounds_s"]
                    measured[h] = got[h]
                    jobs.append(got["ddp"])
                # DDP's own row: the median over the jobs of its backward and
                # of the no-sync backward beside it.
                ddp = dict(jobs[0])
                for f in ("backward_s", "no_sync_backward_s", "cpu_s", "no_sync_cpu_s"):
                    ddp[f] = statistics.median(j[f] for j in jobs)
                ddp["exposed_sync_s"] = ddp["backward_s"] - ddp["no_sync_backward_s"]
                ddp["rounds_s"] = ddp["ddp_rounds_s"] = [t for j in jobs for t in j["rounds_s"]]
                for f in ("threads_cpu_s", "no_sync_threads_cpu_s"):
                    names = {n for j in jobs for n in j.get(f, {})}
                    ddp[f] = {n: statistics.median(j.get(f, {}).get(n, 0.0) for j in jobs) for n in sorted(names)}
                measured["ddp"] = ddp
                predicted = {h: predict(a, onnx[m], cluster, cpu, host_file, h) for h in hooks}
                # Hooks timed in different jobs are compared by their ratio
                # to DDP's all-reduce in the same rounds.
                ratio = lambda h: statistics.median(t / d for t, d in zip(measured[h]["rounds_s"],
                                                                           measured[h]["ddp_rounds_s"]))
                fastest = min(hooks, key=ratio)
                for h in hooks:
                    r = measured[h]
                    row = {"rate": rate, "model": m, "hook": h, "backward_s": r["backward_s"],
                           "no_sync_backward_s": r["no_sync_backward_s"], "exposed_s": r["exposed_sync_s"],
                           "auto": auto["sync"]["scheme"], "measured_fastest": "fp32" if fastest == "ddp" else fastest}
                    set_prediction(row, predicted[h])
                    if "phases_s" in r:
                        row["phases_s"] = r["phases_s"]
                    row["rounds_s"], row["ddp_rounds_s"] = r["rounds_s"], r["ddp_rounds_s"]
                    if "cpu_s" in r:
                        row["cpu_s"], row["no_sync_cpu_s"] = r["cpu_s"], r["no_sync_cpu_s"]
                    if "threads_cpu_s" in r:
                        row["threads_cpu_s"] = r["threads_cpu_s"]
                        row["no_sync_threads_cpu_s"] = r["no_sync_threads_cpu_s"]
                    for f in ("gradient_tensors", "ranks_backward_s", "ranks_cpu_s", "ranks_no_sync_cpu_s"):
                        if f in r:
                            row[f] = r[f]
                    row["host_share"] = k / cores
                    print(json.dumps(row), file=out, flush=True)
                    print(f"{rate:>8} {m:<12} {h:<9} backward {r['backward_s']:.4f} s (no sync {r['no_sync_backward_s']:.4f})"
                          f" predicted {row['predicted_backward_s']:.4f} ({row['error']:+.1%})", file=sys.stderr)
        finally:
            subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
    out.close()


if __name__ == "__main__":
    main()
