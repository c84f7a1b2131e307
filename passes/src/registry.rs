//! Passes by name, and pipelines from a comma-separated spec.
//!
//! A pipeline is a comma-separated list of entries; an entry is a pass name
//! optionally followed by arguments:
//!
//! ```text
//! infer-shapes,amp,dce                   plain names
//! uniform=f16                            NAME=VALUE: the pass's main argument (a precision)
//! amp(policy=my.json,override=/encoder/*=f32,override=*Softmax*=f16)
//! autocast(dtype=bf16,mode=inference)    NAME(KEY=VALUE,...): named arguments
//! ```
//!
//! Commas inside parentheses belong to the entry. Keys may repeat where a pass
//! takes a list (`override`). Precision passes (`amp`, `autocast`, `uniform`,
//! `cascade`) take: the main value or `dtype=` (fp16, bf16, fp32, int8, fp8e4m3,
//! or the IR's names f16, f32, i8, f8e4m3),
//! `override=PATTERN=PRECISION` (exact node name or glob with `*` and `?`;
//! the last `=` separates), `mode=training|inference`; `amp` and `autocast`
//! also `policy=` (a built-in name, `tf-amp` / `torch-autocast`, or a JSON
//! file path). `uniform` requires its precision. `campo` and `comp` take
//! what `amp` takes (a `tf-amp` policy); `campo` also `padding=on|off`
//! (Tensor Core padding, on by default) and `refresh=on|off` (price trained
//! weights as `egraph-casts`' refreshed copies, on by default), `comp` also `threshold=X` (the
//! variance proxy's threshold, default 1e-2). `egraph-casts` takes runner
//! limits `iters=`, `nodes=`, `time_ms=`, `policy=` (default `tf-amp`) and
//! `exact=true` (only the rules that keep every bit), `refresh=false` (no
//! refreshed copies of trained weights: per-iteration weight casts stay).

use qsync_ir::infer::infer_shapes;
use qsync_ir::verify::verify;
use qsync_ir::Model;

use qsync_ir::DType;

use crate::dce::Dce;
use crate::fold::FoldConstants;
use crate::manager::{Pass, PassContext, PassError, PassManager, PassOutcome};
use crate::precision::amp::Amp;
use crate::precision::autocast::Autocast;
use crate::precision::campo::Campo;
use crate::precision::cascade::CascadePass;
use crate::precision::comp::{Comp, VarianceProxy};
use crate::precision::oracle::PLAN_PRECISIONS;
use crate::precision::uniform::Uniform;
use crate::precision::{Mode, Override, PlanOptions, Policy};

/// `infer-shapes`: (re-)infer every value's dtype and shape, applying the
/// context's dim bindings. Fails on inconsistent shapes.
#[derive(Debug, Default)]
pub struct InferShapes;

impl Pass for InferShapes {
    fn name(&self) -> &'static str {
        "infer-shapes"
    }

    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let before: Vec<_> = model.graph.all_values().map(|v| model.graph.ty(v).clone()).collect();
        let opset = model.opset();
        let report = infer_shapes(&mut model.graph, opset, &cx.infer);
        if let Some(e) = report.errors.first() {
            return Err(PassError::Failed {
                pass: self.name().into(),
                node: format!("{:?} ({})", e.node, e.op),
                message: e.message.clone(),
            });
        }
        for w in &report.warnings {
            cx.warnings.push(format!("infer-shapes: node {:?} ({}): {}", w.node, w.op, w.message));
        }
        if let Some(b) = report.fixed_batch {
            cx.warnings.push(format!("infer-shapes: the batch is fixed at {b} inside the graph; inputs not rebatched"));
        }
        let changed = model.graph.all_values().zip(before.iter()).filter(|(v, t)| model.graph.ty(*v) != *t).count();
        let summary = format!("{changed} value types updated, {} unknown", report.unknown.len());
        Ok(if changed > 0 { PassOutcome::changed(summary) } else { PassOutcome { changed: false, summary } })
    }
}

/// `verify`: fail if the verifier finds anything.
#[derive(Debug, Default)]
pub struct Verify;

impl Pass for Verify {
    fn name(&self) -> &'static str {
        "verify"
    }

    fn run(&self, model: &mut Model, _cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        verify(&model.graph, model.opset()).map_err(|errors| PassError::Verify { pass: self.name().into(), errors })?;
        Ok(PassOutcome { changed: false, summary: "ok".into() })
    }
}

/// Names of every registered pass, in the order they are documented.
pub fn available_passes() -> &'static [&'static str] {
    &[
        "infer-shapes",
        "fold-constants",
        "dce",
        "verify",
        "amp",
        "autocast",
        "uniform",
        "cascade",
        "campo",
        "comp",
        "egraph-casts",
    ]
}

/// A pipeline entry's arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassArgs {
    /// `NAME=VALUE`'s value.
    pub main: Option<String>,
    /// `NAME(K=V,...)`'s pairs, in order.
    pub named: Vec<(String, String)>,
}

impl PassArgs {
    fn is_empty(&self) -> bool {
        self.main.is_none() && self.named.is_empty()
    }

    fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.named.iter().filter(move |(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn last<'a>(&'a self, key: &'a str) -> Option<&'a str> {
        self.all(key).last()
    }
}

/// Split a pipeline spec at commas outside parentheses.
fn split_entries(spec: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in spec.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(spec[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(spec[start..].trim());
    out
}

/// Parse one entry: `name`, `name=value` or `name(k=v,...)`.
pub fn parse_entry(entry: &str) -> Result<(String, PassArgs), PassError> {
    let bad = |message: &str| PassError::BadArguments { entry: entry.into(), message: message.into() };
    let entry = entry.trim();
    if let Some(open) = entry.find('(') {
        let inner = entry[open + 1..].strip_suffix(')').ok_or_else(|| bad("missing `)` at the end"))?;
        let mut args = PassArgs::default();
        for kv in split_entries(inner).into_iter().filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| bad("arguments are KEY=VALUE"))?;
            args.named.push((k.trim().to_string(), v.trim().to_string()));
        }
        return Ok((entry[..open].trim().to_string(), args));
    }
    match entry.split_once('=') {
        Some((name, v)) => {
            Ok((name.trim().to_string(), PassArgs { main: Some(v.trim().to_string()), named: Vec::new() }))
        }
        None => Ok((entry.to_string(), PassArgs::default())),
    }
}

fn precision_options(name: &str, args: &PassArgs, allowed: &[&str]) -> Result<(Option<DType>, PlanOptions), PassError> {
    let bad = |message: String| PassError::BadArguments { entry: name.into(), message };
    for (k, _) in &args.named {
        if !allowed.contains(&k.as_str()) {
            return Err(bad(format!("unknown argument `{k}` (takes {})", allowed.join(", "))));
        }
    }
    let dtype = match args.main.as_deref().or(args.last("dtype")) {
        Some(d) => Some(
            // One vocabulary with the planner and `simulate` (fp16, int8, …),
            // the IR's dtype names (f16, i8, …) accepted too.
            d.parse::<qsync_cost::Precision>()
                .ok()
                .map(|p| p.storage_dtype())
                .or_else(|| DType::from_name(d))
                .filter(|d| PLAN_PRECISIONS.contains(d))
                .ok_or_else(|| {
                    bad(format!(
                        "`{d}` is not a plan precision (fp32, bf16, fp16, fp8e4m3, int8; or f32, f16, f8e4m3, i8)"
                    ))
                })?,
        ),
        None => None,
    };
    let overrides =
        args.all("override").map(Override::parse).collect::<Result<Vec<_>, _>>().map_err(|e| bad(e.to_string()))?;
    let mode = match args.last("mode") {
        None | Some("training") => Mode::Training,
        Some("inference") => Mode::Inference,
        Some(m) => return Err(bad(format!("mode `{m}` is not training or inference"))),
    };
    let options = PlanOptions { dtype: dtype.unwrap_or(DType::F16), overrides, mode };
    Ok((dtype, options))
}

fn policy_arg(name: &str, args: &PassArgs, default: &str) -> Result<Policy, PassError> {
    Policy::load(args.last("policy").unwrap_or(default))
        .map_err(|e| PassError::BadArguments { entry: name.into(), message: e.to_string() })
}

/// A pass from a pipeline entry (`name`, `name=value`, `name(k=v,...)`).
pub fn pass_by_name(entry: &str) -> Result<Box<dyn Pass>, PassError> {
    let (name, args) = parse_entry(entry)?;
    pass_with_args(&name, &args)
}

/// A pass by name with parsed arguments.
pub fn pass_with_args(name: &str, args: &PassArgs) -> Result<Box<dyn Pass>, PassError> {
    const PREC: &[&str] = &["dtype", "override", "mode"];
    const WITH_POLICY: &[&str] = &["dtype", "override", "mode", "policy"];
    let no_args = |p: Box<dyn Pass>| {
        if args.is_empty() {
            Ok(p)
        } else {
            Err(PassError::BadArguments { entry: name.into(), message: "this pass takes no arguments".into() })
        }
    };
    match name {
        "infer-shapes" => no_args(Box::new(InferShapes)),
        "fold-constants" => no_args(Box::<FoldConstants>::default()),
        "dce" => no_args(Box::new(Dce)),
        "verify" => no_args(Box::new(Verify)),
        "amp" => {
            let (_, options) = precision_options(name, args, WITH_POLICY)?;
            Ok(Box::new(Amp::new(policy_arg(name, args, "tf-amp")?, options)?))
        }
        "autocast" => {
            let (_, options) = precision_options(name, args, WITH_POLICY)?;
            Ok(Box::new(Autocast::new(policy_arg(name, args, "torch-autocast")?, options)?))
        }
        "uniform" => {
            let (dtype, options) = precision_options(name, args, PREC)?;
            if dtype.is_none() {
                return Err(PassError::BadArguments {
                    entry: name.into(),
                    message: "needs a precision: `uniform=f16`".into(),
                });
            }
            Ok(Box::new(Uniform { options }))
        }
        "campo" => {
            let (_, options) =
                precision_options(name, args, &["dtype", "override", "mode", "policy", "padding", "refresh"])?;
            let on_off = |key: &str| match args.last(key) {
                None | Some("on") => Ok(true),
                Some("off") => Ok(false),
                Some(v) => Err(PassError::BadArguments {
                    entry: name.into(),
                    message: format!("{key} `{v}` is not on or off"),
                }),
            };
            let (padding, refresh) = (on_off("padding")?, on_off("refresh")?);
            let mut campo = Campo::new(policy_arg(name, args, "tf-amp")?, options, padding)?;
            campo.refresh = refresh;
            Ok(Box::new(campo))
        }
        "comp" => {
            let (_, options) = precision_options(name, args, &["dtype", "override", "mode", "policy", "threshold"])?;
            let threshold = match args.last("threshold") {
                None => VarianceProxy::DEFAULT_THRESHOLD,
                Some(v) => v.parse::<f64>().ok().filter(|t| t.is_finite() && *t >= 0.0).ok_or_else(|| {
                    PassError::BadArguments {
                        entry: name.into(),
                        message: format!("threshold `{v}` is not a non-negative number"),
                    }
                })?,
            };
            Ok(Box::new(Comp::new(policy_arg(name, args, "tf-amp")?, options, threshold)?))
        }
        "cascade" => {
            let (dtype, options) = precision_options(name, args, PREC)?;
            Ok(Box::new(CascadePass { dtype, options }))
        }
        "egraph-casts" => {
            let bad = |message: String| PassError::BadArguments { entry: name.into(), message };
            let mut limits = crate::egraph::Limits::default();
            let (mut exact, mut refresh) = (false, true);
            for (k, v) in &args.named {
                let num = || v.parse::<u64>().map_err(|_| bad(format!("`{k}={v}`: not a number")));
                match k.as_str() {
                    "iters" => limits.iters = num()? as usize,
                    "nodes" => limits.nodes = num()? as usize,
                    "time_ms" => limits.time = std::time::Duration::from_millis(num()?),
                    "policy" => {}
                    "exact" | "refresh" => {
                        let b = match v.as_str() {
                            "true" | "1" => true,
                            "false" | "0" => false,
                            _ => return Err(bad(format!("`{k}={v}`: expected true or false"))),
                        };
                        if k == "exact" {
                            exact = b;
                        } else {
                            refresh = b;
                        }
                    }
                    _ => {
                        return Err(bad(format!(
                            "unknown argument `{k}` (takes iters, nodes, time_ms, policy, exact, refresh)"
                        )))
                    }
                }
            }
            if args.main.is_some() {
                return Err(bad("takes only named arguments".into()));
            }
            let policy = policy_arg(name, args, "tf-amp")?;
            Ok(Box::new(crate::egraph::EgraphCasts { limits, policy, exact, refresh }))
        }
        _ => Err(PassError::UnknownPass { name: name.into(), available: available_passes().join(", ") }),
    }
}

/// A pipeline from `a,b=v,c(k=v)` (see the module doc; whitespace around
/// entries is ignored; empty entries are an error).
pub fn pipeline_from_spec(spec: &str) -> Result<PassManager, PassError> {
    let mut pm = PassManager::new();
    for entry in split_entries(spec) {
        pm.add(pass_by_name(entry)?);
    }
    Ok(pm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_arguments() {
        assert_eq!(
            split_entries("a, amp(policy=x.json,override=/e/*=f32), uniform=f16"),
            vec!["a", "amp(policy=x.json,override=/e/*=f32)", "uniform=f16"]
        );
        let (n, a) = parse_entry("amp(policy=x.json,override=/e/*=f32,override=b=f16)").expect("parse");
        assert_eq!(n, "amp");
        assert_eq!(a.all("override").collect::<Vec<_>>(), vec!["/e/*=f32", "b=f16"]);
        let (n, a) = parse_entry("uniform=bf16").expect("parse");
        assert_eq!((n.as_str(), a.main.as_deref()), ("uniform", Some("bf16")));
        assert!(pipeline_from_spec("infer-shapes,dce").is_ok());
        assert!(pipeline_from_spec("uniform").is_err());
        assert!(pipeline_from_spec("uniform=f99").is_err());
        // Both vocabularies: the planner's (fp16, int8) and the IR's (f16, i8).
        for p in ["fp16", "f16", "int8", "i8", "fp32", "f32", "bf16", "fp8", "fp8e4m3", "f8e4m3"] {
            assert!(pipeline_from_spec(&format!("uniform={p}")).is_ok(), "{p}");
            assert!(pipeline_from_spec(&format!("amp(dtype={p})")).is_ok(), "{p}");
        }
        assert!(pipeline_from_spec("dce=1").is_err());
        assert!(pipeline_from_spec("amp(bogus=1)").is_err());
        assert!(pipeline_from_spec("amp(policy=torch-autocast)").is_err());
        assert!(pipeline_from_spec("amp(policy=tf-amp,dtype=bf16,mode=inference),autocast=bf16,cascade").is_ok());
    }
}
