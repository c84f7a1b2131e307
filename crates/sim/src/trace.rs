//! Chrome trace export (the JSON Perfetto and `chrome://tracing` open).
//!
//! One process per device type (`pid` = type index + 1, named `v100 x16`),
//! thread 0 its compute stream and thread 1 its communication stream.
//! Complete events (`ph: "X"`) carry `ts`/`dur` in µs rounded to the
//! nanosecond; zero-length kernels (shape arithmetic) are left out. Keys come
//! in struct order, so the same simulation always gives the same bytes.

use serde::Serialize;

use crate::sim::bwd_steps;
use crate::{SimResult, Simulator};

#[derive(Serialize)]
struct Trace {
    #[serde(rename = "traceEvents")]
    trace_events: Vec<Event>,
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
}

#[derive(Serialize)]
struct Event {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    ph: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: usize,
    tid: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Args>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Args {
    Name { name: String },
    SortIndex { sort_index: usize },
    Bucket { bytes: u64, ready_us: f64 },
}

fn ns(us: f64) -> f64 {
    (us * 1000.0).round() / 1000.0
}

fn meta(name: &str, pid: usize, tid: usize, args: Args) -> Event {
    Event { name: name.into(), cat: None, ph: "M", ts: None, dur: None, pid, tid, args: Some(args) }
}

fn span(name: String, cat: &'static str, start: f64, dur: f64, pid: usize, tid: usize, args: Option<Args>) -> Event {
    Event { name, cat: Some(cat), ph: "X", ts: Some(ns(start)), dur: Some(ns(dur)), pid, tid, args }
}

impl Simulator {
    /// The current simulation as a pretty-printed Chrome trace.
    pub fn chrome_trace_json(&mut self) -> String {
        let result = self.result().clone();
        serde_json::to_string_pretty(&self.chrome_trace(&result)).unwrap_or_default()
    }

    /// [`Simulator::chrome_trace_json`] without `&mut`: `None` when a change
    /// since the last [`Simulator::result`] is not simulated yet.
    pub fn chrome_trace_json_cached(&self) -> Option<String> {
        let result = self.result.as_ref()?;
        Some(serde_json::to_string_pretty(&self.chrome_trace(result)).unwrap_or_default())
    }

    fn chrome_trace(&self, result: &SimResult) -> Trace {
        let mut ev = Vec::new();
        for (t, (tl, ty)) in self.timelines.iter().zip(&self.cluster.types).enumerate() {
            let pid = t + 1;
            ev.push(meta("process_name", pid, 0, Args::Name { name: format!("{} x{}", ty.name, ty.count()) }));
            ev.push(meta("process_sort_index", pid, 0, Args::SortIndex { sort_index: t }));
            ev.push(meta("thread_name", pid, 0, Args::Name { name: "compute".into() }));
            ev.push(meta("thread_name", pid, 1, Args::Name { name: "communication".into() }));
            let n = tl.n_ops();
            let mut push = |name: String, cat, k: usize| {
                if tl.dur[k] > 0.0 {
                    ev.push(span(name, cat, tl.start(k), tl.dur[k], pid, 0, None));
                }
            };
            for (i, op) in tl.program.ops.iter().enumerate() {
                push(op.name.clone(), "forward", i);
            }
            for (i, op) in tl.program.ops.iter().enumerate().rev() {
                let (dg, wg) = bwd_steps(n, i);
                push(format!("{}.dgrad", op.name), "backward", dg);
                push(format!("{}.wgrad", op.name), "backward", wg);
            }
            let d = &result.devices[t];
            let opt = tl.program.optimizer_us;
            if opt > 0.0 {
                ev.push(span("optimizer".into(), "optimizer", d.finish_us - opt, opt, pid, 0, None));
            }
            for (c, coll) in result.collectives.iter().enumerate() {
                let args = Args::Bucket { bytes: coll.bytes, ready_us: ns(coll.ready_us[t]) };
                let dur = coll.end_us - coll.start_us;
                ev.push(span(format!("allreduce #{c}"), "comm", coll.start_us, dur, pid, 1, Some(args)));
            }
        }
        Trace { trace_events: ev, display_time_unit: "ms" }
    }
}
