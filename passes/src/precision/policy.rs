//! Operator precision policies as data, and per-node overrides.
//!
//! **Reads:** a JSON policy (shipped ones in `passes/policies/*.json`, or a
//! user's file) mapping ONNX op types to categories.
//! **Guarantees:** a parsed [`Policy`] gives every op type exactly one
//! [`Category`]; an op listed twice is an error.
//! **Requires:** nothing.
//!
//! Two kinds of policy exist. `tf-amp` (TensorFlow auto mixed precision):
//! `allow`, `infer`, `deny`, `clear`; unlisted ops are [`Category::Unlisted`]
//! (stay fp32 and stop propagation). `torch-autocast` (PyTorch): `lower`,
//! `fp32`, `promote`, `follow`; unlisted ops follow their inputs.
//!
//! File format:
//! ```json
//! { "name": "my-amp", "kind": "tf-amp", "lists": { "allow": ["Conv"], "deny": ["Exp"] } }
//! ```
//!
//! [`Override`]s pin nodes by exact name or glob (`*` any run of characters,
//! `/` included; `?` one character) to a precision; they are applied after
//! the policy has decided, the first matching override winning.

use std::collections::BTreeMap;

use qsync_ir::DType;
use serde::Deserialize;

/// The category of an op type under a policy.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum Category {
    // tf-amp
    Allow,
    Infer,
    Deny,
    Clear,
    // torch-autocast
    Lower,
    Fp32,
    Promote,
    Follow,
    /// Not in any list of a `tf-amp` policy.
    Unlisted,
}

/// Which algorithm a policy's lists are for.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum PolicyKind {
    TfAmp,
    TorchAutocast,
}

impl PolicyKind {
    fn categories(self) -> &'static [(&'static str, Category)] {
        match self {
            PolicyKind::TfAmp => &[
                ("allow", Category::Allow),
                ("infer", Category::Infer),
                ("deny", Category::Deny),
                ("clear", Category::Clear),
            ],
            PolicyKind::TorchAutocast => &[
                ("lower", Category::Lower),
                ("fp32", Category::Fp32),
                ("promote", Category::Promote),
                ("follow", Category::Follow),
            ],
        }
    }
}

/// A parsed policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub name: String,
    pub kind: PolicyKind,
    ops: BTreeMap<String, Category>,
}

/// Why a policy or override did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("policy `{source_name}`: {message}")]
    Bad { source_name: String, message: String },
    #[error("unknown built-in policy `{0}` (built in: tf-amp, torch-autocast)")]
    UnknownBuiltin(String),
    #[error("override `{0}` is not PATTERN=PRECISION (e.g. `/encoder/*=f32`)")]
    BadOverride(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    name: String,
    kind: String,
    #[serde(default)]
    #[allow(dead_code)]
    doc: String,
    lists: BTreeMap<String, Vec<String>>,
}

const TF_AMP: &str = include_str!("../../policies/tf-amp.json");
const TORCH_AUTOCAST: &str = include_str!("../../policies/torch-autocast.json");

impl Policy {
    /// A shipped policy: `tf-amp` or `torch-autocast`.
    pub fn builtin(name: &str) -> Result<Policy, PolicyError> {
        match name {
            "tf-amp" => Policy::from_json(TF_AMP, "tf-amp.json"),
            "torch-autocast" => Policy::from_json(TORCH_AUTOCAST, "torch-autocast.json"),
            _ => Err(PolicyError::UnknownBuiltin(name.into())),
        }
    }

    /// Parse a policy; `source_name` names it in errors.
    pub fn from_json(text: &str, source_name: &str) -> Result<Policy, PolicyError> {
        let bad = |message: String| PolicyError::Bad { source_name: source_name.into(), message };
        let f: PolicyFile = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let kind = match f.kind.as_str() {
            "tf-amp" => PolicyKind::TfAmp,
            "torch-autocast" => PolicyKind::TorchAutocast,
            k => return Err(bad(format!("unknown kind `{k}` (expected tf-amp or torch-autocast)"))),
        };
        let mut ops = BTreeMap::new();
        for (list, names) in &f.lists {
            let Some(&(_, cat)) = kind.categories().iter().find(|(n, _)| n == list) else {
                let expected: Vec<&str> = kind.categories().iter().map(|(n, _)| *n).collect();
                return Err(bad(format!(
                    "unknown list `{list}` for kind {} (expected {})",
                    f.kind,
                    expected.join(", ")
                )));
            };
            for op in names {
                if let Some(prev) = ops.insert(op.clone(), cat) {
                    return Err(bad(format!("op `{op}` is in two lists ({prev:?} and {cat:?})")));
                }
            }
        }
        Ok(Policy { name: f.name, kind, ops })
    }

    /// A built-in name, else a path to a JSON file.
    pub fn load(name_or_path: &str) -> Result<Policy, PolicyError> {
        match Policy::builtin(name_or_path) {
            Ok(p) => Ok(p),
            Err(_) => {
                let text = std::fs::read_to_string(name_or_path).map_err(|e| PolicyError::Bad {
                    source_name: name_or_path.into(),
                    message: format!("cannot read: {e}"),
                })?;
                Policy::from_json(&text, name_or_path)
            }
        }
    }

    /// The category of an ONNX op type.
    pub fn category(&self, op_type: &str) -> Category {
        self.ops.get(op_type).copied().unwrap_or(match self.kind {
            PolicyKind::TfAmp => Category::Unlisted,
            PolicyKind::TorchAutocast => Category::Follow,
        })
    }
}

/// Pin the nodes whose name matches `pattern` to `precision`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    pub pattern: String,
    pub precision: DType,
}

impl Override {
    /// Parse `PATTERN=PRECISION`; the pattern may itself contain `=` (the
    /// last one separates).
    pub fn parse(s: &str) -> Result<Override, PolicyError> {
        let (pat, p) = s.rsplit_once('=').ok_or_else(|| PolicyError::BadOverride(s.into()))?;
        // fp16 / int8 (the planner's names) or f16 / i8 (the IR's).
        let precision = p
            .trim()
            .parse::<qsync_cost::Precision>()
            .ok()
            .map(|p| p.storage_dtype())
            .or_else(|| DType::from_name(p.trim()))
            .ok_or_else(|| PolicyError::BadOverride(s.into()))?;
        if pat.is_empty() {
            return Err(PolicyError::BadOverride(s.into()));
        }
        Ok(Override { pattern: pat.to_string(), precision })
    }

    pub fn matches(&self, name: &str) -> bool {
        glob_match(self.pattern.as_bytes(), name.as_bytes())
    }
}

/// The precision the first matching override gives `name`.
pub fn override_for(overrides: &[Override], name: &str) -> Option<DType> {
    overrides.iter().find(|o| o.matches(name)).map(|o| o.precision)
}

/// `*` matches any run (including `/`), `?` one byte; everything else literally.
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pat.len() && (pat[p] == b'?' || pat[p] == s[i]) {
            p += 1;
            i += 1;
        } else if p < pat.len() && pat[p] == b'*' {
            star = Some((p, i));
            p += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse() {
        let tf = Policy::builtin("tf-amp").expect("tf-amp");
        assert_eq!(tf.category("Conv"), Category::Allow);
        assert_eq!(tf.category("Exp"), Category::Deny);
        assert_eq!(tf.category("NoSuchOp"), Category::Unlisted);
        let pt = Policy::builtin("torch-autocast").expect("torch");
        assert_eq!(pt.category("MatMul"), Category::Lower);
        assert_eq!(pt.category("Softmax"), Category::Fp32);
        assert_eq!(pt.category("Concat"), Category::Promote);
        assert_eq!(pt.category("Relu"), Category::Follow);
    }

    #[test]
    fn bad_policies_are_errors() {
        let e = Policy::from_json(r#"{"name":"x","kind":"tf-amp","lists":{"lower":["Conv"]}}"#, "x.json");
        assert!(e.expect_err("bad list").to_string().contains("unknown list `lower`"));
        let e =
            Policy::from_json(r#"{"name":"x","kind":"tf-amp","lists":{"allow":["Conv"],"deny":["Conv"]}}"#, "x.json");
        assert!(e.expect_err("dup").to_string().contains("two lists"));
        assert!(Policy::from_json("{", "x.json").is_err());
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"/encoder/*", b"/encoder/layer.0/MatMul"));
        assert!(glob_match(b"*MatMul", b"/a/MatMul"));
        assert!(glob_match(b"conv?", b"conv1"));
        assert!(!glob_match(b"conv?", b"conv12"));
        assert!(glob_match(b"a*b*c", b"axxbyyc"));
        assert!(!glob_match(b"a*b*c", b"axxbyy"));
        let o = Override::parse("/enc=oder/*=f32").expect("parse");
        assert_eq!((o.pattern.as_str(), o.precision), ("/enc=oder/*", DType::F32));
        assert!(Override::parse("x=f99").is_err());
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;

    #[test]
    fn a_user_policy_file_loads_and_drives_amp() {
        let dir = std::env::temp_dir().join(format!("qsync-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let path = dir.join("mine.json");
        std::fs::write(&path, r#"{"name":"mine","kind":"tf-amp","lists":{"allow":["Gemm"],"clear":["Relu"]}}"#)
            .expect("write");
        let p = Policy::load(path.to_str().expect("utf8")).expect("load");
        assert_eq!(
            (p.name.as_str(), p.category("Gemm"), p.category("Conv")),
            ("mine", Category::Allow, Category::Unlisted)
        );
        let spec = format!("amp(policy={})", path.display());
        assert!(crate::pipeline_from_spec(&spec).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
