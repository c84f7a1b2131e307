//! `qsyncc host-kernels`: the synchronization kernels' throughput on this
//! host, measured on the runtime's own CPU engine (`qsync_runtime::HostEngine`,
//! the code every host path runs), written as the `seconds = r·elements + c`
//! fits the predictor prices the host paths with (`qsync_sim::SyncKernels`).
//!
//! Each kernel runs at five sizes — `--elements` and 1/2, 1/4, 1/8 and 1/16
//! of it — on `--threads` threads at once (as many as ranks share the host,
//! so memory bandwidth and cores are shared as in a job). The fit goes
//! through the medians at the smallest and largest sizes; the seconds per
//! element at every size are kept too (`SyncKernels::by_size`), since a
//! gradient small enough to stay in the caches runs its kernels faster
//! than the fit, set by the memory-bound sizes, says. The pipelined
//! schemes' kernels (16-bit casts, int8/int4 quantize and
//! dequantize-accumulate) are also timed as the pipeline calls them
//! (`SyncKernels::pieces`): piece by piece (the runtime's pipeline chunk)
//! over every size of the ladder, and on one piece alone. Beside the schemes'
//! kernels: `sum` (f32 `a += b`, what a host engine's all-reduce computes)
//! and `tcp`, the CPU time to move a byte between two processes through the
//! kernel's TCP stack over loopback (sender and receiver together: wall
//! time when the process has one core, e.g. under `taskset -c 0`; else the
//! two threads' on-CPU time from `/proc/thread-self/schedstat`, which may
//! leave out softirq time the kernel accounts apart). The file (schema
//! `qsync-host-kernels/1`) records the CPU, the threads and the sizes, and
//! `simulate` / `plan` take it as `--host-kernels FILE`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use qsync_kernels::{Half, QBits, Rounding};
use qsync_runtime::sync::block::Quantizer;
use qsync_runtime::{HostEngine, KernelEngine};
use qsync_sim::sync::LADDER;
use qsync_sim::{PieceKernels, PieceRates, SizeRates, SyncKernels};
use serde::{Deserialize, Serialize};

/// Schema name of the file.
pub const SCHEMA: &str = "qsync-host-kernels/1";

/// Arguments of `qsyncc host-kernels`.
#[derive(clap::Args, Debug)]
pub struct HostKernelsArgs {
    /// Where to write the measurement (JSON).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Threads measuring at once: the ranks that share one host.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: u32,
    /// Elements of the largest size (the others are 1/2, 1/4, 1/8 and 1/16 of it).
    #[arg(long, default_value_t = 1 << 22, value_parser = clap::value_parser!(u64).range(4096..=1 << 28))]
    pub elements: u64,
    /// Timed repetitions per size (the median is kept).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeats: u32,
    /// Also time the size ladder in this many processes at once, each on
    /// one thread pinned to one of the first N cores this process may run
    /// on, every repetition of every kernel started in all of them
    /// together: their medians are `kernels.corun_by_size`, what kernels
    /// that run in lockstep on ranks sharing the machine meet (0: not
    /// measured).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub corun: u32,
    /// One of `--corun`'s processes: pinned to this core, it times the
    /// ladder, starting each repetition when the parent says (a byte each
    /// way on stdout and stdin), and writes `{"measured_s": {...}}`.
    #[arg(long, hide = true)]
    pub corun_core: Option<usize>,
}

/// The file `host-kernels` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostKernelsFile {
    pub schema: String,
    /// `/proc/cpuinfo`'s model name, or `unknown`.
    pub cpu: String,
    pub threads: u32,
    /// The sizes measured (`kernels.by_size`'s), smallest first.
    pub elements: Vec<u64>,
    pub kernels: SyncKernels,
    /// Seconds measured per kernel and size (medians), for the record.
    pub measured_s: std::collections::BTreeMap<String, Vec<f64>>,
    /// Where a figure comes from when something other than this command
    /// measured it (e.g. `tcp_r` measured across a real link), by field.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sources: std::collections::BTreeMap<String, String>,
}

/// Read a `--host-kernels` file.
pub fn load(path: &Path) -> Result<SyncKernels> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--host-kernels {}", path.display()))?;
    let f: HostKernelsFile = serde_json::from_str(&text).with_context(|| {
        format!("--host-kernels {}: not a {SCHEMA} file (what `qsyncc host-kernels` writes)", path.display())
    })?;
    if f.schema != SCHEMA {
        bail!("--host-kernels {}: schema `{}`, expected `{SCHEMA}`", path.display(), f.schema);
    }
    let k = f.kernels;
    for (what, v) in [
        ("quantize_r", k.quantize_r),
        ("quantize_c", k.quantize_c),
        ("dequantize_r", k.dequantize_r),
        ("dequantize_c", k.dequantize_c),
        ("cast16_r", k.cast16_r),
        ("cast16_c", k.cast16_c),
        ("bf16_r", k.bf16_r.unwrap_or(0.0)),
        ("nbit_finish_r", k.nbit_finish_r.unwrap_or(0.0)),
        ("nbit_decode_r", k.nbit_decode_r.unwrap_or(0.0)),
        ("qgz_decode_r", k.qgz_decode_r.unwrap_or(0.0)),
        ("zero_r", k.zero_r.unwrap_or(0.0)),
        ("sum_r", k.sum_r.unwrap_or(0.0)),
        ("tcp_r", k.tcp_r.unwrap_or(0.0)),
        ("message_s", k.message_s.unwrap_or(0.0)),
        ("ring_tcp_r", k.ring_tcp_r.unwrap_or(0.0)),
        ("ring_step_s", k.ring_step_s.unwrap_or(0.0)),
        ("gather_step_s", k.gather_step_s.unwrap_or(0.0)),
        ("busy_round_s", k.busy_round_s.unwrap_or(0.0)),
        ("interleave_r", k.interleave_r.unwrap_or(0.0)),
        ("hook_call_s", k.hook_call_s.unwrap_or(0.0)),
        ("bucket_r", k.bucket_r.unwrap_or(0.0)),
        ("bucket_tensor_s", k.bucket_tensor_s.unwrap_or(0.0)),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            bail!("--host-kernels {}: {what} = {v} is not a non-negative number", path.display());
        }
    }
    for (what, table) in [("nbit_pack_r", k.nbit_pack_r), ("nbit_unpack_r", k.nbit_unpack_r)] {
        if let Some(v) = table.into_iter().flatten().find(|v| !(v.is_finite() && *v >= 0.0)) {
            bail!("--host-kernels {}: {what} holds {v}, not a non-negative number", path.display());
        }
    }
    if let Some(ladder) = &k.by_size {
        if let Some(v) = ladder.iter().flat_map(|r| r.values()).find(|v| !(v.is_finite() && *v >= 0.0)) {
            bail!("--host-kernels {}: by_size holds {v}, not a non-negative number", path.display());
        }
        if ladder.windows(2).any(|w| w[0].elements >= w[1].elements) || ladder[0].elements <= 0.0 {
            bail!("--host-kernels {}: by_size's sizes must grow from a positive first one", path.display());
        }
    }
    if let Some(p) = &k.pieces {
        let rows = std::iter::once(&p.cached).chain(&p.streamed);
        if let Some(v) = rows.flat_map(|r| r.values()).find(|v| !(v.is_finite() && *v >= 0.0)) {
            bail!("--host-kernels {}: pieces holds {v}, not a non-negative number", path.display());
        }
        if p.streamed.windows(2).any(|w| w[0].elements >= w[1].elements) || p.cached.elements <= 0.0 {
            bail!("--host-kernels {}: pieces' sizes must be positive, the streamed ones growing", path.display());
        }
    }
    Ok(k)
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// A gradient-like buffer (deterministic, mixed signs and magnitudes).
fn buffer(n: usize) -> Vec<f32> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e-2
        })
        .collect()
}

const GROUP: usize = 512;

fn bits_of(kernel: &str) -> QBits {
    if kernel.ends_with('4') {
        QBits::Int4
    } else {
        QBits::Int8
    }
}

/// qgZ's quantization stage at `bits`, as the schemes configure it.
fn quantizer(bits: QBits) -> Quantizer {
    Quantizer { bits, group: GROUP, rounding: Rounding::Nearest }
}

/// The block of `x` at `bits` (scales, then codes): what a qgZ stage
/// sends, and what dequantize-accumulate reads. The runtime's own encoder,
/// so the time is the whole of what a stage does to its input: per group
/// its range and finiteness, scale and codes, written in place in the
/// block (one pass, `KernelEngine::encode_block`).
fn block(x: &[f32], bits: QBits) -> Result<Vec<u8>> {
    let q = quantizer(bits);
    let mut out = Vec::with_capacity(q.block_len(x.len()));
    q.encode(&HostEngine, x, 0, &mut out, None)?;
    Ok(out)
}

/// n-bit's width in a kernel's name: `pack` / `unpack` are 2-bit, `pack4`
/// 4-bit, and so on.
fn nbit_width(kernel: &str) -> u8 {
    match kernel.trim_start_matches("un").trim_start_matches("pack") {
        "1" => 1,
        "4" => 4,
        "8" => 8,
        _ => 2,
    }
}

/// n-bit's encoding of `x` at `bits`, as the scheme runs it (range,
/// finiteness, pack).
fn packed(x: &[f32], bits: u8) -> Result<Vec<u8>> {
    Ok(qsync_runtime::sync::nbit::encode(&HostEngine, x, bits, Rounding::Nearest, 0)?)
}

/// One kernel as the schemes call it, on `x` (`coded`: its block or its
/// packed bytes, for dequantize-accumulate and unpack-accumulate into
/// `out`).
fn run_once(kernel: &str, x: &[f32], coded: &[u8], out: &mut [f32]) -> Result<()> {
    let e = HostEngine;
    match kernel {
        // What a qgZ stage does to its input: its block, by the runtime's
        // encoder.
        "quantize" | "quantize4" => {
            std::hint::black_box(block(x, bits_of(kernel))?);
        }
        // The runtime's decoding of received blocks into a sum in one pass,
        // divided: of 4 blocks (`dequantize*`, a shard's reduction) and of
        // one (`qmean*`, a gathered shard's decoding), which [`ladder_of`]
        // fits into what a block adds and what the pass costs beyond them.
        "dequantize" | "dequantize4" | "qmean" | "qmean4" => {
            // On the stack: nothing is allocated inside the timed call.
            let four = [coded; UNPACK_BUFFERS];
            let blocks = if kernel.starts_with("qmean") { &four[..1] } else { &four[..] };
            quantizer(bits_of(kernel))
                .decode_mean(&e, blocks, blocks.len() as f32, out)
                .map_err(|e| anyhow::anyhow!("{e:?}"))?
        }
        // What n-bit does per element: range, finiteness, pack; and its
        // decoding of every rank's packed buffer (`coded` here) into the
        // sum in one pass, divided: of 4 buffers (`unpack*`) and of one
        // (`mean`, 2-bit), which [`ladder_of`] fits into what a buffer adds
        // and what the pass costs beyond them.
        "pack" | "pack1" | "pack4" | "pack8" => {
            std::hint::black_box(packed(x, nbit_width(kernel))?);
        }
        "unpack" | "unpack1" | "unpack4" | "unpack8" | "mean" => {
            let four = [coded; UNPACK_BUFFERS];
            let bufs = if kernel == "mean" { &four[..1] } else { &four[..] };
            e.unpack_mean(bufs, x.len(), nbit_width(kernel), bufs.len() as f32, out)
                .map_err(|e| anyhow::anyhow!("{e:?}"))?
        }
        // What the 16-bit schemes do per element, twice: narrow (scaled)
        // into wire bytes, and widen wire bytes into a sum. The fit halves
        // the time: `cast16_r` is one cast.
        "cast16" | "cast_bf16" => {
            let half = if kernel == "cast16" { Half::F16 } else { Half::BF16 };
            let mut wire = vec![0u8; 2 * x.len()];
            e.cast_to_le(half, x, 4.0, &mut wire)?;
            e.accumulate_le(half, &wire, out)?;
            std::hint::black_box(&*out);
        }
        // The sums the schemes accumulate blocks into, zeroed first.
        "zero" => {
            qsync_runtime::sync::nbit::zero(out);
            std::hint::black_box(&*out);
        }
        "finish" => {
            qsync_runtime::sync::nbit::zero(out);
            qsync_runtime::sync::nbit::divide(out, 4);
            std::hint::black_box(&*out);
        }
        // DDP's copy of a gradient into its bucket (and of the bucket back):
        // one f32 copy into memory already in place.
        "copy" => {
            out.copy_from_slice(x);
            std::hint::black_box(&*out);
        }
        "sum" => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o += v;
            }
            std::hint::black_box(&*out);
        }
        _ => unreachable!("kernel names are fixed"),
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `kernel` on `n` elements with `threads` running it at
/// once: every repetition starts on all threads together (a barrier) and
/// lasts until the last of them is done, so threads that share cores are
/// timed sharing them (a run shorter than a scheduler slice would otherwise
/// be timed alone).
fn measure(kernel: &'static str, n: usize, threads: u32, repeats: u32, together: Option<&Together>) -> Result<f64> {
    measure_in_pieces(kernel, n, 0, threads, repeats, together)
}

/// A `--corun` process's side of starting each repetition together with
/// the other processes: a byte to the parent on stdout, then a byte back
/// on stdin once every process has sent its own.
struct Together;

impl Together {
    fn wait(&self) -> Result<()> {
        use std::io::{Read, Write};
        let mut out = std::io::stdout().lock();
        out.write_all(b"r").and_then(|()| out.flush()).context("corun: telling the parent this process is ready")?;
        let mut go = [0u8; 1];
        std::io::stdin().lock().read_exact(&mut go).context("corun: the parent went away")?;
        Ok(())
    }
}

/// [`measure`] with `kernel` called piece by piece, `piece` elements at a
/// time (0: one call on all `n`), as the pipelined schemes call it: each
/// piece's input and output slices of the `n`-element buffers, the
/// piece's own codes, and whatever the kernel allocates per call.
fn measure_in_pieces(
    kernel: &'static str,
    n: usize,
    piece: usize,
    threads: u32,
    repeats: u32,
    together: Option<&Together>,
) -> Result<f64> {
    let piece = if piece == 0 { n } else { piece.min(n) };
    let ranges: Vec<std::ops::Range<usize>> =
        (0..n.div_ceil(piece)).map(|i| i * piece..((i + 1) * piece).min(n)).collect();
    let barrier = std::sync::Barrier::new(threads as usize);
    let per_thread: Vec<Result<Vec<f64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (barrier, ranges) = (&barrier, &ranges);
                s.spawn(move || -> Result<Vec<f64>> {
                    let x = buffer(n);
                    let coded = ranges
                        .iter()
                        .map(|r| {
                            if kernel.starts_with("unpack") || kernel == "mean" {
                                packed(&x[r.clone()], nbit_width(kernel))
                            } else {
                                block(&x[r.clone()], bits_of(kernel))
                            }
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let mut out = vec![0.0f32; n];
                    let all = |out: &mut [f32]| -> Result<()> {
                        for (r, c) in ranges.iter().zip(&coded) {
                            run_once(kernel, &x[r.clone()], c, &mut out[r.clone()])?;
                        }
                        Ok(())
                    };
                    all(&mut out)?; // warm-up
                    let mut times = Vec::new();
                    for _ in 0..repeats {
                        barrier.wait();
                        if let Some(t) = together {
                            t.wait()?;
                        }
                        let t = Instant::now();
                        all(&mut out)?;
                        barrier.wait();
                        times.push(t.elapsed().as_secs_f64());
                    }
                    Ok(times)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a measuring thread panicked"))))
            .collect()
    });
    let mut all = Vec::new();
    for r in per_thread {
        all.extend(r?);
    }
    Ok(median(all))
}

/// This thread's time on a CPU so far, ns (`None` where the kernel does
/// not say).
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
}

/// CPU seconds per byte moved through the TCP stack between two threads
/// over loopback: the median of `repeats` transfers of `bytes`.
fn tcp_cost(bytes: usize, repeats: u32) -> Result<f64> {
    use std::io::{Read, Write};
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut costs = Vec::new();
    for _ in 0..repeats.max(1) {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).context("tcp: binding a loopback socket")?;
        let addr = listener.local_addr()?;
        let (wall, cpu) = std::thread::scope(|s| -> Result<(f64, Option<u64>)> {
            let rx = s.spawn(move || -> Result<Option<u64>> {
                let (mut c, _) = listener.accept()?;
                let start = thread_cpu_ns();
                let mut buf = vec![0u8; 1 << 20];
                let mut got = 0;
                while got < bytes {
                    let n = c.read(&mut buf)?;
                    if n == 0 {
                        bail!("tcp: the sender closed after {got} of {bytes} bytes");
                    }
                    got += n;
                }
                c.write_all(b"k")?;
                Ok(start.zip(thread_cpu_ns()).map(|(a, b)| b.saturating_sub(a)))
            });
            let mut c = std::net::TcpStream::connect(addr).context("tcp: connecting over loopback")?;
            let buf = vec![1u8; 1 << 20];
            let start = thread_cpu_ns();
            let t = Instant::now();
            let mut left = bytes;
            while left > 0 {
                let k = left.min(buf.len());
                c.write_all(&buf[..k])?;
                left -= k;
            }
            let mut ack = [0u8; 1];
            c.read_exact(&mut ack)?;
            let wall = t.elapsed().as_secs_f64();
            let mine = start.zip(thread_cpu_ns()).map(|(a, b)| b.saturating_sub(a));
            let theirs = rx.join().unwrap_or_else(|_| Err(anyhow::anyhow!("tcp: the receiving thread panicked")))?;
            Ok((wall, mine.zip(theirs).map(|(a, b)| a + b)))
        })?;
        let seconds = match cpu {
            _ if cores == 1 => wall,
            Some(ns) => ns as f64 * 1e-9,
            None => wall * 2.0,
        };
        costs.push(seconds / bytes as f64);
    }
    Ok(median(costs))
}

/// The size ladder's measurements: every kernel's medians at each size,
/// its fit through the smallest and largest (`r`, `c`), and the seconds
/// per element at each size.
struct Ladder {
    measured: std::collections::BTreeMap<String, Vec<f64>>,
    fits: std::collections::BTreeMap<&'static str, (f64, f64)>,
    by_size: [SizeRates; LADDER],
}

/// The buffers the `unpack*` and `dequantize*` kernels decode at once (the
/// `mean` and `qmean*` kernels: one).
const UNPACK_BUFFERS: usize = 4;

/// A decoding (n-bit's or qgZ's) of [`UNPACK_BUFFERS`] buffers and of one
/// took `t4` and `t1`: fitted as `b·r + d` for `b` buffers, the pass's own
/// cost `d` (beyond the buffers; not below 0). Where the decoding of more
/// buffers did not take longer (a measurement on a few thousand elements
/// can be noise and nothing else), 0: the whole time goes to the buffers.
fn decode_pass(t4: f64, t1: f64) -> f64 {
    let b = UNPACK_BUFFERS as f64;
    if t4 <= t1 {
        return 0.0;
    }
    ((b * t1 - t4) / (b - 1.0)).max(0.0)
}

/// What each of [`UNPACK_BUFFERS`] adds to a decoding of them that took
/// `t4`, beyond the pass's own `d` (`r` above). Positive whenever `t4` is:
/// where `d` (fitted at another width) leaves nothing, the whole time a
/// buffer.
fn per_buffer(t4: f64, d: f64) -> f64 {
    let b = UNPACK_BUFFERS as f64;
    if t4 > d {
        (t4 - d) / b
    } else {
        t4.max(0.0) / b
    }
}

/// The kernels of the size ladder, as `measured_s` names them.
const KERNELS: [&str; 21] = [
    "quantize",
    "dequantize",
    "qmean",
    "cast16",
    "cast_bf16",
    "quantize4",
    "dequantize4",
    "qmean4",
    "pack1",
    "unpack1",
    "pack",
    "unpack",
    "pack4",
    "unpack4",
    "pack8",
    "unpack8",
    "mean",
    "finish",
    "zero",
    "sum",
    "copy",
];

/// Every kernel at every size of `sizes` on `threads` threads at once
/// (each repetition started `together` with other processes where given):
/// the median seconds, by kernel, smallest size first.
fn time_ladder(
    sizes: &[usize; LADDER],
    threads: u32,
    repeats: u32,
    together: Option<&Together>,
) -> Result<std::collections::BTreeMap<String, Vec<f64>>> {
    let mut measured = std::collections::BTreeMap::new();
    for k in KERNELS {
        let t = sizes.iter().map(|&n| measure(k, n, threads, repeats, together)).collect::<Result<Vec<_>>>()?;
        measured.insert(k.to_string(), t);
    }
    Ok(measured)
}

/// The fits and the per-size rates of the seconds `measured` at `sizes`
/// ([`time_ladder`]'s). The casts' entries are one cast's (their calls
/// time two).
fn ladder_of(sizes: &[usize; LADDER], measured: std::collections::BTreeMap<String, Vec<f64>>) -> Result<Ladder> {
    let (small, big) = (sizes[0], sizes[LADDER - 1]);
    let mut fits = std::collections::BTreeMap::new();
    let mut per = std::collections::BTreeMap::new();
    for k in KERNELS {
        let t = match measured.get(k) {
            Some(t) if t.len() == LADDER => t,
            _ => bail!("the measurement has no {LADDER} sizes of `{k}`"),
        };
        let calls = if k.starts_with("cast") { 2.0 } else { 1.0 };
        let r = ((t[LADDER - 1] - t[0]) / (big - small).max(1) as f64).max(0.0);
        let c = (t[0] - r * small as f64).max(0.0);
        fits.insert(k, (r / calls, c / calls));
        per.insert(k, std::array::from_fn::<f64, LADDER, _>(|i| t[i] / sizes[i] as f64 / calls));
    }
    let at = |k: &str, i: usize| per[k][i];
    // n-bit's decoding: per buffer, and beyond the buffers (fitted at 2
    // bits, the same pass at every width).
    let decode = |i: usize| decode_pass(at("unpack", i), at("mean", i));
    let unpack = |k: &str, i: usize| per_buffer(at(k, i), decode(i));
    // qgZ's likewise, each width through its own pair (the pass: int8's).
    let qgz_pass = |i: usize| decode_pass(at("dequantize", i), at("qmean", i));
    let qgz_block = |k: &str, one: &str, i: usize| per_buffer(at(k, i), decode_pass(at(k, i), at(one, i)));
    let by_size = std::array::from_fn(|i| SizeRates {
        elements: sizes[i] as f64,
        quantize: at("quantize", i),
        quantize4: at("quantize4", i),
        dequantize: qgz_block("dequantize", "qmean", i),
        dequantize4: qgz_block("dequantize4", "qmean4", i),
        cast16: at("cast16", i),
        bf16: at("cast_bf16", i),
        nbit_pack: ["pack1", "pack", "pack4", "pack8"].map(|k| at(k, i)),
        nbit_unpack: ["unpack1", "unpack", "unpack4", "unpack8"].map(|k| unpack(k, i)),
        nbit_finish: at("finish", i),
        nbit_decode: Some(decode(i)),
        qgz_decode: Some(qgz_pass(i)),
        sum: at("sum", i),
        // Two copies an element: into the bucket and back.
        bucket: 2.0 * at("copy", i),
    });
    Ok(Ladder { measured, fits, by_size })
}

/// Pins the calling process to `core` (Linux; elsewhere an error).
fn pin_to(core: usize) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        qsync_runtime::affinity::pin_to_core(core).with_context(|| format!("corun: pinning to core {core}"))
    }
    #[cfg(not(target_os = "linux"))]
    {
        bail!("corun: pinning a process to core {core} needs Linux")
    }
}

/// The first `n` cores this process may run on, or why there are fewer.
fn corun_cores(n: usize) -> Result<Vec<usize>> {
    #[cfg(target_os = "linux")]
    let cores = qsync_runtime::affinity::allowed_cores().context("corun: reading this process's cores")?;
    #[cfg(not(target_os = "linux"))]
    let cores: Vec<usize> = bail!("--corun: pinning a process to a core needs Linux");
    if cores.len() < n {
        bail!("--corun {n}: this process may run on {} core(s) ({cores:?}); one process a core needs {n}", cores.len());
    }
    Ok(cores[..n].to_vec())
}

/// `--corun N`: the ladder timed in N processes of this command at once,
/// one pinned to each of the first N cores this process may run on, every
/// repetition started in all of them together (this process relays one
/// byte from each to each), and the medians over the processes.
fn corun_ladder(a: &HostKernelsArgs, sizes: &[usize; LADDER], cores: &[usize]) -> Result<[SizeRates; LADDER]> {
    use std::io::{Read, Write};
    let n = cores.len();
    let exe = std::env::current_exe().context("corun: locating this program")?;
    let dir = std::env::temp_dir().join(format!("qsync-corun-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("corun: creating {}", dir.display()))?;
    let outs: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("core{i}.json"))).collect();
    let mut children = Vec::with_capacity(n);
    for (out, &core) in outs.iter().zip(cores) {
        let child = std::process::Command::new(&exe)
            .args(["host-kernels", "--threads", "1", "--corun-core", &core.to_string()])
            .args(["--elements", &a.elements.to_string(), "--repeats", &a.repeats.to_string(), "-o"])
            .arg(out)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("corun: starting a measuring process")?;
        children.push(child);
    }
    // Relay: once every process has said it is ready, let them all go;
    // until every one has finished (its stdout closes).
    let result = (|| -> Result<()> {
        let mut ins: Vec<_> = children.iter_mut().map(|c| c.stdin.take().expect("piped")).collect();
        let mut from: Vec<_> = children.iter_mut().map(|c| c.stdout.take().expect("piped")).collect();
        loop {
            let mut ready = 0;
            for f in from.iter_mut() {
                let mut b = [0u8; 1];
                if f.read(&mut b).context("corun: reading a measuring process")? == 1 {
                    ready += 1;
                }
            }
            if ready == 0 {
                return Ok(());
            }
            if ready != n {
                bail!("corun: {} of {n} measuring processes ended while the others were measuring", n - ready);
            }
            for i in ins.iter_mut() {
                i.write_all(b"g").and_then(|()| i.flush()).context("corun: starting a repetition")?;
            }
        }
    })();
    let mut failed = Vec::new();
    for (i, c) in children.iter_mut().enumerate() {
        match c.wait() {
            Ok(st) if st.success() => {}
            Ok(st) => failed.push(format!("the process on core {} exited with {st}", cores[i])),
            Err(e) => failed.push(format!("the process on core {}: {e}", cores[i])),
        }
    }
    let read = |p: &PathBuf| -> Result<std::collections::BTreeMap<String, Vec<f64>>> {
        #[derive(Deserialize)]
        struct Out {
            measured_s: std::collections::BTreeMap<String, Vec<f64>>,
        }
        let text = std::fs::read_to_string(p).with_context(|| format!("corun: reading {}", p.display()))?;
        Ok(serde_json::from_str::<Out>(&text).with_context(|| format!("corun: {}", p.display()))?.measured_s)
    };
    let each = if failed.is_empty() {
        result.and_then(|()| outs.iter().map(read).collect::<Result<Vec<_>>>())
    } else {
        Err(anyhow::anyhow!("corun: {}", failed.join("; ")))
    };
    let _ = std::fs::remove_dir_all(&dir);
    let each = each?;
    // The median over the processes of each kernel's seconds at each size.
    let mut measured = std::collections::BTreeMap::new();
    for k in KERNELS {
        let at = |i: usize| each.iter().map(|m| m.get(k).and_then(|t| t.get(i)).copied()).collect::<Option<Vec<f64>>>();
        let t = (0..LADDER)
            .map(|i| at(i).map(median).with_context(|| format!("corun: a process did not time `{k}` at every size")))
            .collect::<Result<Vec<_>>>()?;
        measured.insert(k.to_string(), t);
    }
    Ok(ladder_of(sizes, measured)?.by_size)
}

fn ns_list(r: &[f64; 4]) -> String {
    r.iter().map(|v| format!("{:.2}", v * 1e9)).collect::<Vec<_>>().join("/")
}

/// Measure and write; returns the text for stdout.
pub fn run(a: &HostKernelsArgs) -> Result<String> {
    // As `sync-bench` runs the schemes: buffers reused, not page-faulted
    // anew at every call (a kernel returning a fresh 32 MiB vector would
    // otherwise be timed with its page faults).
    qsync_runtime::memory::retain_freed_memory();
    let big = a.elements as usize;
    // The ladder: 1/16, 1/8, 1/4, 1/2 of the largest size and itself.
    let sizes: [usize; LADDER] = std::array::from_fn(|i| (big >> (LADDER - 1 - i)).max(1024));
    if let Some(core) = a.corun_core {
        pin_to(core)?;
        let measured = time_ladder(&sizes, 1, a.repeats, Some(&Together))?;
        let text = serde_json::to_string(&serde_json::json!({ "measured_s": measured }))?;
        std::fs::write(&a.output, text).with_context(|| format!("writing {}", a.output.display()))?;
        return Ok(String::new());
    }
    // The cores `--corun` pins its processes to, checked before anything is
    // timed.
    let corun_cores = match a.corun {
        0 => None,
        1 => bail!("--corun 1: timing the kernels on every core at once needs at least 2 processes"),
        n => Some(corun_cores(n as usize)?),
    };
    let l = ladder_of(&sizes, time_ladder(&sizes, a.threads, a.repeats, None)?)?;
    let fit = |k: &str| l.fits[k];
    let (quantize_r, quantize_c) = fit("quantize");
    // What a block adds (the pass beyond the blocks: `qgz_decode_r`).
    let (dequantize4_blocks, dequantize_c) = fit("dequantize");
    let qgz_decode_r = decode_pass(dequantize4_blocks, fit("qmean").0);
    let dequantize_r = per_buffer(dequantize4_blocks, qgz_decode_r);
    let (cast16_r, cast16_c) = fit("cast16");
    let (bf16_r, _) = fit("cast_bf16");
    let (quantize4_r, _) = fit("quantize4");
    let dequantize4_r = per_buffer(fit("dequantize4").0, decode_pass(fit("dequantize4").0, fit("qmean4").0));
    let widths = |kernels: [&str; 4]| kernels.map(|k| fit(k).0);
    let nbit_pack_r = widths(["pack1", "pack", "pack4", "pack8"]);
    let nbit_decode_r = decode_pass(fit("unpack").0, fit("mean").0);
    let nbit_unpack_r = widths(["unpack1", "unpack", "unpack4", "unpack8"]).map(|r| per_buffer(r, nbit_decode_r));
    let (pack_r, unpack_r) = (nbit_pack_r[1], nbit_unpack_r[1]);
    let (nbit_finish_r, _) = fit("finish");
    let (zero_r, _) = fit("zero");
    let (sum_r, _) = fit("sum");
    let (copy_r, _) = fit("copy");
    let corun_by_size = corun_cores.map(|cores| corun_ladder(a, &sizes, &cores)).transpose()?;
    // The pipelined schemes' kernels as the pipeline calls them: piece by
    // piece over each size of the ladder (the gradient streamed, each
    // piece's buffers fresh from the kept free memory), and on one piece
    // alone (the sum of the ranks' pieces and its re-encoding).
    let chunk = qsync_runtime::scheme::DEFAULT_PIPELINE_CHUNK;
    let piece_row = |elements: usize, piece: usize| -> Result<PieceKernels> {
        let rate = |k: &'static str| -> Result<f64> {
            Ok(measure_in_pieces(k, elements, piece, a.threads, a.repeats, None)? / elements as f64)
        };
        Ok(PieceKernels {
            elements: elements as f64,
            // Two casts a call (narrow, widen-accumulate), as above.
            cast16: rate("cast16")? / 2.0,
            bf16: rate("cast_bf16")? / 2.0,
            quantize: rate("quantize")?,
            // One block's whole decoding, piece by piece, as the pipeline
            // decodes the gathered pieces (its sums of `P` blocks are
            // priced at the same rate a block, on a piece in the caches).
            dequantize: rate("qmean")?,
            quantize4: rate("quantize4")?,
            dequantize4: rate("qmean4")?,
        })
    };
    let cached = piece_row(chunk.min(big), 0)?;
    let streamed = sizes.iter().map(|&n| piece_row(n, chunk)).collect::<Result<Vec<_>>>()?;
    let pieces = PieceRates {
        cached,
        streamed: streamed.try_into().map_err(|_| anyhow::anyhow!("one row per size of the ladder"))?,
    };
    let tcp_bytes = (big * 16).clamp(1 << 24, 1 << 30);
    let tcp_r = tcp_cost(tcp_bytes, a.repeats.min(5))?;
    let file = HostKernelsFile {
        schema: SCHEMA.into(),
        cpu: cpu_name(),
        threads: a.threads,
        elements: sizes.iter().map(|&n| n as u64).collect(),
        kernels: SyncKernels {
            quantize_r,
            quantize_c,
            dequantize_r,
            dequantize_c,
            cast16_r,
            cast16_c,
            bf16_r: Some(bf16_r),
            quantize4_r: Some(quantize4_r),
            dequantize4_r: Some(dequantize4_r),
            pack_r: Some(pack_r),
            unpack_r: Some(unpack_r),
            nbit_pack_r: Some(nbit_pack_r),
            nbit_unpack_r: Some(nbit_unpack_r),
            nbit_finish_r: Some(nbit_finish_r),
            nbit_decode_r: Some(nbit_decode_r),
            qgz_decode_r: Some(qgz_decode_r),
            zero_r: Some(zero_r),
            sum_r: Some(sum_r),
            tcp_r: Some(tcp_r),
            // Measured per message with the engine itself, under mpirun
            // (sync-bench --collective all-to-all), not by this command.
            message_s: None,
            ring_tcp_r: None,
            ring_step_s: None,
            // Measured with gloo's all-gather (gloo_probe.py), as busy_round_s.
            gather_step_s: None,
            // Measured beside a compute thread with the engine itself
            // (scripts/validate/gloo_probe.py), not by this command.
            busy_round_s: None,
            // Measured beside a backward pass (gloo_probe.py), as busy_round_s.
            interleave_r: None,
            hook_call_s: None,
            // Two copies an element: into the bucket and back.
            bucket_r: Some(2.0 * copy_r),
            // DDP's own work per parameter: measured through DDP itself
            // (scripts/validate/gloo_probe.py), not by this command.
            bucket_tensor_s: None,
            by_size: Some(l.by_size),
            corun_by_size,
            pieces: Some(pieces),
        },
        measured_s: l.measured,
        sources: Default::default(),
    };
    let text = serde_json::to_string_pretty(&file)? + "\n";
    std::fs::write(&a.output, &text).with_context(|| format!("writing {}", a.output.display()))?;
    Ok(format!(
        "{} ({} thread(s)), ns per element: quantize {:.2} (int4 {:.2}), decode {:.2} a block (int4 {:.2}) plus {:.2} a pass, \
         16-bit cast {:.2} (bf16 {:.2}), n-bit pack {} and decode {} a buffer (1, 2, 4, 8 bits) plus {:.2} a pass, zero-and-divide {:.2}, \
         f32 zero {:.2}, f32 sum {:.2}, f32 copy {:.2}; TCP {:.3} \
         ns of CPU per byte -> {}\n",
        file.cpu,
        a.threads,
        quantize_r * 1e9,
        quantize4_r * 1e9,
        dequantize_r * 1e9,
        dequantize4_r * 1e9,
        qgz_decode_r * 1e9,
        cast16_r * 1e9,
        bf16_r * 1e9,
        ns_list(&nbit_pack_r),
        ns_list(&nbit_unpack_r),
        nbit_decode_r * 1e9,
        nbit_finish_r * 1e9,
        zero_r * 1e9,
        sum_r * 1e9,
        copy_r * 1e9,
        tcp_r * 1e9,
        a.output.display()
    ))
}
