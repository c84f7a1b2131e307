//! Pieces of the manifest: the sharding section, the model's hash, the
//! external data a written model carries, and the rounding of times.

use serde_json::json;

/// The manifest's `sharding`: the chosen plan's stage, per device type its
/// shard fraction, what it all-gathers in which precision and whether it
/// checkpoints, the units and the collectives in the order they run. A DDP
/// plan is `replicate` with every fraction 1 and no collectives here (its
/// all-reduce is `sync`'s).
pub(crate) fn sharding_json(out: &qsync_planner::Outcome, allowed: &[&str], budget: f64) -> serde_json::Value {
    let s = out.sharded.as_ref();
    let chosen = s.and_then(|s| s.methods().into_iter().find(|(k, _)| *k == out.chosen).map(|(_, e)| e.result.clone()));
    // Per unit: the module it is (what `qsync.fsdp.shard_model` wraps),
    // its parameters and, per device type, whether it is checkpointed.
    let kind = |u: &qsync_sim::shard::Unit| match (u.block, s.map_or("blocks", |s| s.units.rule)) {
        (false, _) => "root",
        (true, "blocks") => "block",
        (true, _) => "part",
    };
    let units: Vec<serde_json::Value> = s
        .map(|s| {
            s.units
                .units
                .iter()
                .map(|u| {
                    let checkpoint: serde_json::Map<String, serde_json::Value> = match &chosen {
                        Some(r) => {
                            r.devices.iter().map(|d| (d.name.clone(), (u.block && d.checkpoint).into())).collect()
                        }
                        None => out.chosen_eval.types.iter().map(|t| (t.name.clone(), false.into())).collect(),
                    };
                    json!({ "name": u.name, "module": u.module, "kind": kind(u), "parameters": u.params as u64,
                            "checkpoint": checkpoint })
                })
                .collect()
        })
        .unwrap_or_default();
    let unit_rule = s.map_or("blocks", |s| s.units.rule);
    let Some(r) = chosen else {
        let devices: serde_json::Map<String, serde_json::Value> = out
            .chosen_eval
            .types
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    json!({ "stage": "replicate", "shard_fraction": 1.0, "all_gather": null,
                            "reduce_scatter_precision": null, "checkpoint": false }),
                )
            })
            .collect();
        return json!({
            "stage": "replicate", "fsdp_strategy": "NO_SHARD", "hpz": false, "uneven_shares": false,
            "unit_rule": unit_rule, "units": units, "devices": devices, "collectives": [],
        });
    };
    let spec = &r.spec;
    let backward_scope = match spec.stage {
        qsync_sim::Stage::FullShard if spec.hpz => Some("node"),
        qsync_sim::Stage::FullShard => Some("cluster"),
        qsync_sim::Stage::HybridShard => Some("node"),
        _ => None,
    };
    let devices: serde_json::Map<String, serde_json::Value> = r
        .devices
        .iter()
        .map(|d| {
            (
                d.name.clone(),
                json!({
                    "stage": spec.stage.name(),
                    "shard_fraction": d.share,
                    "all_gather": {
                        "what": "the weights of one unit at a time, the next prefetched",
                        "precision": spec.gather.name(),
                        "forward_scope": if spec.stage == qsync_sim::Stage::HybridShard { "node" } else { "cluster" },
                        "backward_scope": backward_scope,
                    },
                    "reduce_scatter_precision": spec.reduce.name(),
                    "checkpoint": d.checkpoint,
                    "memory": d.memory,
                    "replicated_compute_ms": d.replicated_compute_us / 1e3,
                }),
            )
        })
        .collect();
    let collectives: Vec<serde_json::Value> = r
        .collectives
        .iter()
        .map(
            |c| json!({ "kind": c.kind, "phase": c.phase, "unit": c.unit, "scope": c.scope, "precision": c.precision }),
        )
        .collect();
    let p: u64 = r.devices.iter().map(|d| u64::from(d.count)).sum();
    json!({
        "stage": spec.stage.name(), "fsdp_strategy": spec.stage.fsdp_name(), "hpz": spec.hpz,
        "uneven_shares": spec.uneven,
        "collective_precisions": {
            "allowed": allowed, "error_budget": budget,
            "all_gather": { "precision": spec.gather.name(), "relative_error": spec.gather.relative_error() },
            "reduce_scatter": { "precision": spec.reduce.name(), "relative_error": spec.reduce.relative_error(p) },
        },
        "unit_rule": unit_rule, "units": units, "devices": devices,
        "collectives": collectives,
    })
}

pub(crate) fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Lower-case hex SHA-256 of the model file, recorded in the manifest.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The first BatchNormalization that normalizes one value per sample and
/// channel (its input is `[N, C]` or `[N, C, 1, …]`): batch statistics of a
/// single sample do not exist and PyTorch refuses to train it, so the graph
/// needs a local batch of at least 2.
pub(crate) fn single_value_batchnorm(g: &qsync_ir::Graph) -> Option<String> {
    g.schedule().into_iter().map(|n| g.node(n)).filter(|node| node.op == qsync_ir::Op::BatchNormalization).find_map(
        |node| {
            let shape = g.ty(node.input(0)?).shape.as_ref()?;
            (shape.len() >= 2 && shape[2..].iter().all(|d| d.as_const() == Some(1))).then(|| node.name.clone())
        },
    )
}

/// The external-data files `qsync_onnx::export_file` copies beside a
/// written model: plain relative locations that exist under the model's
/// base directory.
pub(crate) fn external_data_copied(model: &qsync_ir::Model) -> Vec<String> {
    let Some(base) = &model.base_dir else { return Vec::new() };
    let g = &model.graph;
    let mut out = std::collections::BTreeSet::new();
    for &v in g.inits() {
        if let Some(qsync_ir::Tensor { data: qsync_ir::TensorData::External { location, .. }, .. }) = g.value(v).init()
        {
            if matches!(qsync_ir::tensor::resolve_external(Some(base), location), Ok(Some(_))) {
                out.insert(location.clone());
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_known_inputs() {
        assert_eq!(super::sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(super::sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
