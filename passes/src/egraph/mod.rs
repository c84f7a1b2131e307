//! Cast placement by equality saturation (egg): the `egraph-casts` pass.
//!
//! One module per concept: [`language`] (the e-graph language: typed values,
//! Cast, region ops, uninterpreted leaves), [`rules`] (the rewrite rules and
//! the policy that makes each sound), [`extract`] (DAG-aware extraction with
//! cost-oracle costs; the ILP check), [`pass`] (import, runner limits,
//! rebuild, the [`crate::Pass`]).

pub mod extract;
pub mod language;
pub mod pass;
pub mod rules;

pub use pass::{count_casts, gradient_values, refresh_weight_casts, EgraphCasts, IlpCheck, Limits};
