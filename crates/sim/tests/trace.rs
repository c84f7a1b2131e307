//! The Chrome trace of the hand-worked straggler model (see `handworked.rs`),
//! with two buckets: `fast` has them ready at 59 and 94, `slow` at 118 and
//! 188; all-reduce 0 runs 118–158 (40 kB), all-reduce 1 188–248 (60 kB);
//! optimizers 248–258 (fast) and 248–268 (slow).

mod common;

use common::{solo, tiny};
use qsync_sim::{Cluster, SimConfig, Simulator};

fn straggler() -> Simulator {
    let cfg = SimConfig { bucket_cap_bytes: 40_000, ..SimConfig::default() };
    Simulator::new(Cluster::new(vec![solo("fast", 8), solo("slow", 8)]), vec![tiny(1.0), tiny(2.0)], cfg)
        .expect("valid input")
}

#[test]
fn trace_snapshot() {
    insta::assert_snapshot!(straggler().chrome_trace_json());
}

#[test]
fn trace_is_chrome_format() {
    let v: serde_json::Value = serde_json::from_str(&straggler().chrome_trace_json()).expect("valid JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let spans: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    // Per type: 4 forward, 6 non-empty backward, 1 optimizer, 2 all-reduces.
    assert_eq!(spans.len(), 2 * 13);
    for e in &spans {
        assert!(e["ts"].as_f64().expect("ts") >= 0.0 && e["dur"].as_f64().expect("dur") > 0.0);
        assert!(matches!(e["tid"].as_u64(), Some(0 | 1)) && matches!(e["pid"].as_u64(), Some(1 | 2)));
    }
    let names: Vec<_> = events.iter().filter(|e| e["name"] == "process_name").map(|e| &e["args"]["name"]).collect();
    assert_eq!(names, ["fast x1", "slow x1"]);
    // Events on one lane never overlap.
    for pid in [1, 2] {
        for tid in [0, 1] {
            let mut lane: Vec<(f64, f64)> = spans
                .iter()
                .filter(|e| e["pid"] == pid && e["tid"] == tid)
                .map(|e| (e["ts"].as_f64().unwrap_or(0.0), e["dur"].as_f64().unwrap_or(0.0)))
                .collect();
            lane.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert!(lane.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "{pid}/{tid}: {lane:?}");
        }
    }
}
