//! `qsyncc sync-bench` across an emulated two-node cluster
//! (`scripts/netcluster.sh`: network namespaces joined by a bridge, each
//! node's link shaped with tc in both directions), 2 ranks per node over
//! Open MPI's TCP transport, so every inter-node byte crosses a real (veth)
//! interface whose counters the kernel keeps.
//!
//! What cannot be noise:
//! - the bytes crossing each node's link, read from the node interface's
//!   counters before and after a job, equal what the benchmark reports as
//!   inter-node bytes (per rank, per synchronization) times the ranks of a
//!   node and the synchronizations of the job — up to the packets' headers
//!   and the job's own control traffic (tolerance below);
//! - a job over a 100 Mbit/s link takes at least its bytes over the rate,
//!   and measurably longer than the same job over a 1 Gbit/s link;
//! - a link left idle sends no faster than its rate when traffic resumes
//!   (a real NIC has no burst above its line rate);
//! - a small message (an ACK, a control message) does not wait behind
//!   another flow's queued data;
//! - a link cut mid-job (down, or 100% loss) ends every rank with an error
//!   naming the operation, within the deadline, and leaves nothing behind.
//!
//! Needs root, `ip netns`, tc's tbf and Open MPI's `mpirun`; without them
//! each test prints `SKIPPED: <reason>` and returns. Every cluster gets its
//! own prefix and subnet and is torn down by a guard, also when a test
//! fails.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

/// One cluster at a time: concurrent jobs on two cores would stretch each
/// other's timings.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netcluster.sh")
}

fn sh(args: &[&str]) -> Output {
    Command::new("bash").arg(script()).args(args).output().expect("run scripts/netcluster.sh")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Why this machine cannot build a cluster, if it cannot.
fn unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    for tool in ["ip", "tc", "mpirun"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
        if !found.map(|o| o.status.success()).unwrap_or(false) {
            return Some(format!("`{tool}` is not installed (scripts/setup.sh installs iproute2 and Open MPI)"));
        }
    }
    // One name per probe: the tests of this file probe concurrently.
    static PROBES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let probe = format!("qsprobe{}x{n}", std::process::id() % 100_000);
    let made = Command::new("ip").args(["netns", "add", &probe]).output();
    match made {
        Ok(o) if o.status.success() => {
            let _ = Command::new("ip").args(["netns", "del", &probe]).output();
            None
        }
        Ok(o) => Some(format!("`ip netns add` fails here: {}", text(&o).trim())),
        Err(e) => Some(format!("cannot run `ip`: {e}")),
    }
}

macro_rules! skip_unless_available {
    () => {
        if let Some(why) = unavailable() {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}

/// Whether python3 is missing (`what` needs it); prints why the test skips.
fn python_missing(what: &str) -> bool {
    let ok = Command::new("python3").arg("-c").arg("").status().map(|s| s.success()).unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED: python3 is not installed ({what})");
    }
    !ok
}

/// A cluster that is torn down when dropped.
struct Cluster {
    prefix: String,
    subnet: String,
}

impl Cluster {
    /// `nodes` nodes at `rate`; `id` tells apart the clusters of one test
    /// process, the process id those of concurrent test runs.
    fn up(id: u32, nodes: usize, rate: &str) -> Cluster {
        let pid = std::process::id();
        let prefix = format!("qt{id}{:x}", pid % 0x10000);
        let subnet = format!("10.{}.{}", 90 + id, pid % 250);
        let _ = sh(&["down", "--prefix", &prefix]);
        let out = sh(&["up", "--nodes", &nodes.to_string(), "--rate", rate, "--prefix", &prefix, "--subnet", &subnet]);
        assert!(out.status.success(), "netcluster up failed:\n{}", text(&out));
        Cluster { prefix, subnet }
    }

    /// Per node: (tx bytes, rx bytes) of its interface.
    fn counters(&self) -> Vec<(u64, u64)> {
        let out = sh(&["stats", "--prefix", &self.prefix, "--json"]);
        assert!(out.status.success(), "netcluster stats failed:\n{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
        v["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| (n["tx_bytes"].as_u64().expect("tx_bytes"), n["rx_bytes"].as_u64().expect("rx_bytes")))
            .collect()
    }

    /// `qsyncc sync-bench` with 2 ranks per node; rank 0's JSON report.
    fn bench(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new("bash")
            .arg(script())
            .args(["run", "--prefix", &self.prefix, "--ranks-per-node", "2", "--timeout", "120", "--"])
            .arg(env!("CARGO_BIN_EXE_qsyncc"))
            .arg("sync-bench")
            .args(args)
            .args(["--nodes", "2", "--json"])
            .output()
            .expect("run netcluster.sh run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "sync-bench {args:?} failed ({:?}):\n{}", out.status, text(&out));
        let line = stdout.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON report:\n{stdout}"));
        serde_json::from_str(line).expect("JSON report")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = sh(&["down", "--prefix", &self.prefix]);
        if !out.status.success() {
            eprintln!("netcluster down --prefix {} failed:\n{}", self.prefix, text(&out));
        }
    }
}

fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("`{key}` missing or not a number in {v}"))
}

/// Bytes through each node's link in both directions equal the reported
/// inter-node bytes, within the overhead of headers and control traffic.
///
/// Tolerance: a TCP segment carries at most 1448 payload bytes under 66
/// bytes of Ethernet, IP and TCP (with timestamps) headers, +4.6% at worst
/// (veths hand the counters GSO super-packets, so it is usually far less);
/// ACKs travel in the other direction, at most one 66-byte packet per two
/// segments (+2.3% of that direction's data, which here is as large);
/// Open MPI adds a match header per fragment (< 0.1%). Fixed costs — PMIx
/// wire-up, barriers, the digests and phase reports gathered — stay under
/// 512 KiB. So: reported ≤ counted ≤ 1.08 × reported + 512 KiB, in each
/// direction of each node.
#[test]
fn bytes_on_each_link_match_the_reported_inter_node_bytes() {
    skip_unless_available!();
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up(1, 2, "1gbit");
    let (iterations, warmup) = (2, 1);
    for scheme in ["fp32", "fp16", "qgz-int8"] {
        let before = cluster.counters();
        let r = cluster.bench(&[
            "--scheme",
            scheme,
            "--bytes",
            "8M",
            "--iterations",
            &iterations.to_string(),
            "--warmup",
            &warmup.to_string(),
            "--skip-f32",
        ]);
        let after = cluster.counters();
        assert!(r["bitwise_identical"].as_bool().unwrap_or(false), "{scheme}: ranks disagree: {r}");
        // Every rank of a node receives its inter-node bytes through the
        // node's link; by symmetry each node sends as much as it receives.
        let syncs = (1 + warmup + iterations) as f64;
        let expected = 2.0 * f(&r, "inter_node_bytes_per_rank") * syncs;
        assert!(expected > 0.0, "{scheme}: no inter-node bytes reported: {r}");
        // fp32 is the engine's own all-reduce, whose bytes the runtime
        // cannot count: it reports a ring's 2·M·(P−1)/P split by the share
        // of remote peers, an upper bound. Open MPI 4.1 picks recursive
        // halving and doubling at this size, which crosses the nodes with
        // M/2 per rank (a quarter of the buffer each way, twice): half the
        // ring model on 2 nodes. Any algorithm moves at least that.
        let low = if scheme == "fp32" { expected / 2.0 } else { expected };
        for (node, (b, a)) in before.iter().zip(&after).enumerate() {
            for (dir, counted) in [("tx", a.0 - b.0), ("rx", a.1 - b.1)] {
                let counted = counted as f64;
                eprintln!(
                    "{scheme}: node {node} {dir} {counted:.0} bytes, reported {expected:.0} ({:+.2}%)",
                    100.0 * (counted / expected - 1.0)
                );
                assert!(
                    counted >= low && counted <= 1.08 * expected + 512.0 * 1024.0,
                    "{scheme}: node {node} {dir}: {counted} bytes crossed the link, the benchmark reports {expected} \
                     (2 ranks × {} inter-node bytes × {syncs} synchronizations)",
                    f(&r, "inter_node_bytes_per_rank")
                );
            }
        }
    }
}

/// The same job over a 100 Mbit/s link takes at least its bytes over the
/// rate, and clearly longer than over 1 Gbit/s (the fast one is CPU-bound
/// on a loaded two-core machine, so the rates are ten times apart).
#[test]
fn a_slow_link_is_slower() {
    skip_unless_available!();
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let args = ["--scheme", "fp16", "--bytes", "8M", "--iterations", "3", "--warmup", "1", "--skip-f32"];
    let mut seconds = Vec::new();
    for (id, rate, bits_per_s) in [(2, "100mbit", 100e6), (3, "1gbit", 1e9)] {
        let cluster = Cluster::up(id, 2, rate);
        let r = cluster.bench(&args);
        let s = f(&r, "seconds");
        // What a node sends per synchronization cannot leave faster than the rate.
        let floor = 2.0 * f(&r, "inter_node_bytes_per_rank") * 8.0 / bits_per_s;
        eprintln!("fp16 8 MiB at {rate}: {s:.4} s per synchronization (link floor {floor:.4} s)");
        assert!(s >= 0.95 * floor, "{rate}: {s} s is faster than the link allows ({floor} s)");
        seconds.push(s);
        drop(cluster);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        seconds[0] > 1.5 * seconds[1],
        "100 Mbit/s took {} s, 1 Gbit/s {} s: the slow link is not measurably slower",
        seconds[0],
        seconds[1]
    );
}

/// Seconds from sending `bytes` from node 0 to node 1 until node 1 has them
/// all, each send after `idle_ms` of silence on the link; the fastest of
/// `reps`. Plain TCP between two Python processes in the nodes.
fn idle_then_send_s(c: &Cluster, bytes: usize, idle_ms: u64, reps: usize) -> f64 {
    let server = format!("{}.3", c.subnet);
    let recv = format!(
        "import socket\n\
         s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('{server}', 5599)); s.listen(1); s.settimeout(60); c, _ = s.accept()\n\
         c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n\
         for _ in range({reps}):\n\
         \x20   got = 0\n\
         \x20   while got < {bytes}:\n\
         \x20       b = c.recv(1 << 20)\n\
         \x20       assert b, 'sender closed'\n\
         \x20       got += len(b)\n\
         \x20   c.sendall(b'k')\n"
    );
    let send = format!(
        "import socket, time\n\
         for i in range(100):\n\
         \x20   try: c = socket.create_connection(('{server}', 5599)); break\n\
         \x20   except ConnectionRefusedError: time.sleep(0.05)\n\
         c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); best = 1e9\n\
         for _ in range({reps}):\n\
         \x20   time.sleep({idle} / 1000); t = time.perf_counter(); c.sendall(bytes({bytes})); c.recv(1)\n\
         \x20   best = min(best, time.perf_counter() - t)\n\
         print(best)\n",
        idle = idle_ms
    );
    let ns = |i: usize| format!("{}{i}", c.prefix);
    let mut rx = Command::new("ip")
        .args(["netns", "exec", &ns(1), "python3", "-c", &recv])
        .spawn()
        .expect("start the receiver in node 1");
    let out = Command::new("timeout")
        .args(["60", "ip", "netns", "exec", &ns(0), "python3", "-c", &send])
        .output()
        .expect("run the sender in node 0");
    let _ = rx.kill();
    let _ = rx.wait();
    assert!(out.status.success(), "the sender in node 0 failed:\n{}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("sender printed no time ({e}): {}", text(&out)))
}

/// A link idle for a moment sends no faster than its rate when traffic
/// resumes, as a NIC does: the shaper's bucket, full after the pause, must
/// not let a synchronization's first few hundred KiB cross at the veth's
/// own speed (before the peak rate, 512 KiB crossed 100 Mbit/s in about
/// half the time the rate allows). The floor allows the first super-packet
/// (64 KiB) at once and the rest 5% above the rate: 0.75 of the bytes over
/// the rate.
#[test]
fn an_idle_link_sends_no_faster_than_its_rate() {
    skip_unless_available!();
    if python_missing("the socket probe's two ends") {
        return;
    }
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up(6, 2, "100mbit");
    let bytes = 512 * 1024;
    let s = idle_then_send_s(&cluster, bytes, 300, 3);
    let at_rate = bytes as f64 * 8.0 / 100e6;
    eprintln!("512 KiB after 300 ms idle at 100 Mbit/s: {:.2} ms (the rate allows {:.2} ms)", s * 1e3, at_rate * 1e3);
    assert!(
        s >= 0.75 * at_rate,
        "512 KiB crossed an idle 100 Mbit/s link in {:.2} ms, faster than the rate allows ({:.2} ms): \
         the shaper lets a burst through",
        s * 1e3,
        at_rate * 1e3
    );
}

/// A small message does not queue behind another flow's bulk data: while
/// four TCP streams fill node 0's link towards node 1, a 64-byte ping from
/// node 0 and its reply cross in about a millisecond (the median of 30;
/// measured 0.93-1.05 ms), as a host's fair queueing lets ACKs and control
/// messages through. With one FIFO under the rate (`NETCLUSTER_FIFO=1`)
/// the ping waits behind the streams' queued data: 8.9-10.7 ms, and the test
/// fails. The bound, 4 ms, is a 32 KiB super-packet's time on the link
/// (2.6 ms) plus the two ends' wake-ups.
#[test]
fn small_messages_pass_queued_bulk_data() {
    skip_unless_available!();
    if python_missing("the probe's two ends") {
        return;
    }
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up(7, 2, "100mbit");
    let server = format!("{}.3", cluster.subnet);
    // Node 1: a sink for the bulk streams and an echo for the pings.
    let serve = format!(
        "import socket, threading\n\
         def sink(c):\n\
         \x20   while c.recv(1 << 20): pass\n\
         def echo(c):\n\
         \x20   c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n\
         \x20   while True:\n\
         \x20       b = c.recv(64)\n\
         \x20       if not b: return\n\
         \x20       c.sendall(b)\n\
         def serve(port, f):\n\
         \x20   s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         \x20   s.bind(('{server}', port)); s.listen(4); s.settimeout(60)\n\
         \x20   while True: threading.Thread(target=f, args=(s.accept()[0],), daemon=True).start()\n\
         threading.Thread(target=serve, args=(5601, sink), daemon=True).start()\n\
         serve(5602, echo)\n"
    );
    // Node 0: four bulk streams, then 30 pings while they run; the median
    // round trip in milliseconds.
    let probe = format!(
        "import socket, threading, time, statistics\n\
         def conn(port):\n\
         \x20   for i in range(100):\n\
         \x20       try: return socket.create_connection(('{server}', port))\n\
         \x20       except ConnectionRefusedError: time.sleep(0.05)\n\
         \x20   raise SystemExit('node 1 does not answer')\n\
         stop = False\n\
         def bulk():\n\
         \x20   c = conn(5601); b = bytes(1 << 20)\n\
         \x20   while not stop: c.sendall(b)\n\
         for _ in range(4): threading.Thread(target=bulk, daemon=True).start()\n\
         p = conn(5602); p.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n\
         time.sleep(1.0)\n\
         rtt = []\n\
         for _ in range(30):\n\
         \x20   t = time.perf_counter(); p.sendall(bytes(64)); got = 0\n\
         \x20   while got < 64: got += len(p.recv(64))\n\
         \x20   rtt.append(time.perf_counter() - t); time.sleep(0.02)\n\
         stop = True\n\
         print(statistics.median(rtt) * 1e3)\n"
    );
    let ns = |i: usize| format!("{}{i}", cluster.prefix);
    let mut rx = Command::new("ip")
        .args(["netns", "exec", &ns(1), "python3", "-c", &serve])
        .spawn()
        .expect("start the sink and echo in node 1");
    let before = cluster.counters();
    let out = Command::new("timeout")
        .args(["60", "ip", "netns", "exec", &ns(0), "python3", "-c", &probe])
        .output()
        .expect("run the probe in node 0");
    let after = cluster.counters();
    let _ = rx.kill();
    let _ = rx.wait();
    assert!(out.status.success(), "the probe in node 0 failed:\n{}", text(&out));
    let rtt_ms: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("the probe printed no round trip ({e}): {}", text(&out)));
    // The streams did fill the link: over the probe's 1.6 s or more, node
    // 0 sent at least 1 s of the rate.
    let sent = after[0].0 - before[0].0;
    eprintln!("ping round trip beside four bulk streams at 100 Mbit/s: {rtt_ms:.2} ms (node 0 sent {sent} bytes)");
    assert!(sent as f64 >= 100e6 / 8.0, "the bulk streams sent only {sent} bytes: the link was not full");
    assert!(
        rtt_ms < 4.0,
        "a 64-byte ping took {rtt_ms:.2} ms a round trip beside bulk streams: it queued behind their data"
    );
}

/// A node's link cut in the middle of a job (the interface down, or every
/// packet dropped: neither sends a reset) ends every rank with an error
/// naming the operation it was in, within the deadline plus the launcher's
/// teardown, and `down` leaves nothing behind.
#[test]
fn a_cut_link_ends_every_rank_with_an_error_naming_the_operation() {
    skip_unless_available!();
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Long enough that a loaded machine does not miss it before the cut
    // (rank 0 computes the error reference while the others wait).
    let deadline_s = 10;
    for (id, how) in [(4, "down"), (5, "loss")] {
        let cluster = Cluster::up(id, 2, "1gbit");
        let start = cluster.counters();
        let mut job = Command::new("bash")
            .arg(script())
            .args(["run", "--prefix", &cluster.prefix, "--ranks-per-node", "2", "--timeout", "90", "--"])
            .arg(env!("CARGO_BIN_EXE_qsyncc"))
            .args(["sync-bench", "--scheme", "qgz-int8", "--bytes", "4M", "--nodes", "2", "--iterations", "100000"])
            .args(["--warmup", "0", "--skip-f32", "--timeout", &deadline_s.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the job");
        // Into the timed loop: a few synchronizations' bytes (2 MiB each
        // way per node and synchronization) have crossed node 1's link.
        let t0 = std::time::Instant::now();
        loop {
            let now = cluster.counters();
            if now[1].0 - start[1].0 > 12 << 20 {
                break;
            }
            if let Ok(Some(status)) = job.try_wait() {
                let out = job.wait_with_output().expect("job output");
                panic!("the job ended ({status}) before the link was cut:\n{}", text(&out));
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "the job moved no bytes in 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = sh(&["cut", "1", how, "--prefix", &cluster.prefix]);
        assert!(out.status.success(), "netcluster cut failed:\n{}", text(&out));
        let cut_at = std::time::Instant::now();
        let out = job.wait_with_output().expect("job output");
        let took = cut_at.elapsed();
        let log = text(&out);
        eprintln!("link {how}: the job ended {took:.1?} after the cut with {:?}", out.status);
        assert!(!out.status.success(), "link {how}: the job succeeded:\n{log}");
        assert_ne!(out.status.code(), Some(124), "link {how}: the job hung until netcluster's timeout:\n{log}");
        // The deadline, the watchdog's 2 s grace, mpirun's teardown.
        assert!(took < Duration::from_secs(deadline_s + 20), "link {how}: the job took {took:?} to end:\n{log}");
        for rank in 0..4 {
            let named = log.lines().any(|l| {
                l.contains(&format!("rank {rank}:"))
                    && ["all_to_all_v", "all_gather_v", "barrier", "all_reduce"].iter().any(|op| l.contains(op))
            });
            assert!(named, "link {how}: rank {rank} did not say which operation failed:\n{log}");
        }
        let prefix = cluster.prefix.clone();
        drop(cluster);
        let left = Command::new("sh")
            .args(["-c", &format!("{{ ip netns list; ip -o link show; }} | grep -E '(^| |: ){prefix}' || true")])
            .output()
            .expect("ip");
        assert!(left.stdout.is_empty(), "netcluster down left {}", String::from_utf8_lossy(&left.stdout));
    }
}
