//! The replayer proper: one timeline per device type, merged through the
//! collectives (QSync eq. 6).
//!
//! **Local DFG.** A device runs its forward ops in order, then for each op in
//! reverse its input-gradient and weight-gradient kernels, on one compute
//! stream with no gaps; that stream is the same whatever the network does, so
//! it is a prefix sum over a step array `[fwd_0 … fwd_{n−1}, dgrad_{n−1},
//! wgrad_{n−1}, …, dgrad_0, wgrad_0]`. Weight gradients fill DDP buckets in
//! the order they are produced; a bucket is ready when its last gradient is.
//!
//! **Global DFG.** Collective `n` starts when every type has bucket `n` ready
//! and collective `n−1` has ended, and lasts as long as its slowest
//! participant. Each type's optimizer step starts once its backward is done
//! and the last collective has ended; the iteration ends with the last
//! optimizer step.
//!
//! **The host.** A GPU runs what its host issues: each step may carry what
//! issuing it costs the host (Python, the framework's dispatch, launches),
//! and a step starts when the one before it has ended *and* the host has
//! issued it, the host issuing the steps back to back. A step shorter than
//! its issuing leaves the device waiting (a host-bound step); a long kernel
//! lets the host run ahead. With no host times the stream is the prefix
//! sum above. The optimizer step ends when both the device has run it and
//! the host has issued it after the backward.
//!
//! **Incremental.** Each timeline keeps its step durations in a sum tree, so
//! [`Simulator::set_op_cost`] rewrites three steps and the O(log n) sums
//! above them, and a step's end time is an O(log n) query. The tree's shape
//! depends only on the step count and every sum is recomputed from its two
//! children, so an edited simulation and a fresh one add the same numbers in
//! the same order: both give bit-identical results, whatever the history of
//! edits. The global merge (a pass over the buckets) is redone each time,
//! touching only the buckets' ready steps.

use serde::{Deserialize, Serialize};

use crate::{AllReduceAlgo, Cluster, LocalProgram, OpCost, SimError};

/// Simulation settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// DDP bucket capacity: a bucket closes once it holds at least this many
    /// bytes. PyTorch's default is 25 MiB.
    pub bucket_cap_bytes: u64,
    pub algo: AllReduceAlgo,
    /// How each bucket is synchronized (fp32: the engine's all-reduce by
    /// `algo`; otherwise [`crate::sync`]'s model of the runtime's scheme).
    #[serde(default)]
    pub sync: crate::sync::SyncSpec,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            bucket_cap_bytes: 25 << 20,
            algo: AllReduceAlgo::Hierarchical,
            sync: crate::sync::SyncSpec::default(),
        }
    }
}

/// Results for one device type (every device of the type behaves alike).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceResult {
    pub name: String,
    pub count: u64,
    /// Busy time of the compute stream: forward, backward, optimizer.
    pub compute_us: f64,
    /// Busy time of the communication stream (the collectives' global spans).
    pub comm_us: f64,
    /// Iteration time minus compute: waiting on collectives or on stragglers.
    pub idle_us: f64,
    /// End of the forward pass.
    pub forward_end_us: f64,
    /// End of the backward pass.
    pub backward_end_us: f64,
    /// End of the optimizer step.
    pub finish_us: f64,
    /// Static memory plus every activation saved for backward (the peak is
    /// reached when the forward ends).
    pub peak_memory_bytes: u64,
    pub memory_capacity_bytes: Option<u64>,
    /// Whether the peak fits the capacity (true when no capacity is known).
    pub fits: bool,
}

/// One all-reduce.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CollectiveResult {
    pub bytes: u64,
    /// Per device type, when its bucket was ready.
    pub ready_us: Vec<f64>,
    pub start_us: f64,
    pub end_us: f64,
}

/// One simulated iteration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    pub iteration_us: f64,
    /// Global batch over iteration time (0 when the iteration takes no time).
    pub samples_per_s: f64,
    pub global_batch: u64,
    /// Gradient payload all-reduced per iteration.
    pub allreduce_bytes: u64,
    pub devices: Vec<DeviceResult>,
    pub collectives: Vec<CollectiveResult>,
}

/// A DDP bucket: a run of consecutive gradients in production order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bucket {
    pub bytes: u64,
    /// Index of its last gradient in production order.
    pub last_grad: usize,
    /// Global duration: the slowest type's share.
    pub dur_us: f64,
    /// Per type: CPU time the synchronization takes from the cores that
    /// type computes on ([`Cluster::sync_cpu_us`]; 0 for GPUs).
    pub cpu_us: Vec<f64>,
    /// Per type: DDP's copies of the bucket into place and back, on the
    /// cores that type computes on ([`Cluster::bucket_copy_us`]; 0 for
    /// GPUs): on its compute path whatever the overlap.
    pub copy_us: Vec<f64>,
    /// Per type: what the synchronization's exchange rounds wait, beyond
    /// their work, if it runs wholly beside that type's backward pass
    /// ([`Cluster::sync_busy_wait_us`]; 0 for GPUs).
    pub wait_us: Vec<f64>,
}

/// A range of steps in a [`Timeline`]'s tree: its device time, its host
/// time, and the most the host's issuing runs ahead of the device within it
/// (`max_j (H_j − D_{j−1})` over its steps `j`, with `H` and `D` the host's
/// and the device's sums from the range's start, `H_j` including step `j`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Span {
    d: f64,
    h: f64,
    lead: f64,
}

impl Span {
    const EMPTY: Span = Span { d: 0.0, h: 0.0, lead: f64::NEG_INFINITY };

    fn step(d: f64, h: f64) -> Span {
        Span { d, h, lead: h }
    }

    /// `self` followed by `next`.
    fn then(self, next: Span) -> Span {
        Span { d: self.d + next.d, h: self.h + next.h, lead: self.lead.max(self.h - self.d + next.lead) }
    }
}

/// One device type's local DFG.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    pub program: LocalProgram,
    /// Step durations on the device, see the module doc for the layout.
    pub dur: Vec<f64>,
    /// What issuing each step costs the host (the forward's on its step,
    /// an op's whole backward on its input-gradient step).
    pub host: Vec<f64>,
    /// [`Span`]s over aligned power-of-two ranges, as a complete binary
    /// tree: leaves at `[width, 2·width)` (the steps, padded with empty
    /// steps), node `i` node `2i` then node `2i+1`, the root at 1.
    tree: Vec<Span>,
    width: usize,
    /// Steps of the weight-gradient kernels that produce gradients, in
    /// production order.
    pub grad_steps: Vec<usize>,
    pub saved_bytes: u64,
}

impl Timeline {
    fn new(program: LocalProgram) -> Timeline {
        let n = program.ops.len();
        let mut dur = vec![0.0; 3 * n];
        let mut host = vec![0.0; 3 * n];
        let mut grad_steps = Vec::new();
        for (i, op) in program.ops.iter().enumerate() {
            dur[i] = op.cost.fwd_us;
            host[i] = op.cost.host_fwd_us;
            let (dg, wg) = bwd_steps(n, i);
            dur[dg] = op.cost.input_grad_us;
            host[dg] = op.cost.host_bwd_us;
            dur[wg] = op.cost.weight_grad_us;
        }
        for i in (0..n).rev() {
            if program.ops[i].cost.grad_bytes > 0 {
                grad_steps.push(bwd_steps(n, i).1);
            }
        }
        let saved_bytes = program.ops.iter().map(|o| o.cost.saved_bytes).sum();
        let width = dur.len().max(1).next_power_of_two();
        let mut tree = vec![Span::step(0.0, 0.0); 2 * width];
        for (k, (&d, &h)) in dur.iter().zip(&host).enumerate() {
            tree[width + k] = Span::step(d, h);
        }
        for i in (1..width).rev() {
            tree[i] = tree[2 * i].then(tree[2 * i + 1]);
        }
        Timeline { program, dur, host, tree, width, grad_steps, saved_bytes }
    }

    /// Set step `k`'s device and host time and the spans above it.
    fn set(&mut self, k: usize, us: f64, host_us: f64) {
        self.dur[k] = us;
        self.host[k] = host_us;
        let mut i = self.width + k;
        self.tree[i] = Span::step(us, host_us);
        while i > 1 {
            i /= 2;
            self.tree[i] = self.tree[2 * i].then(self.tree[2 * i + 1]);
        }
    }

    pub fn n_ops(&self) -> usize {
        self.program.ops.len()
    }

    /// End of step `k` on the device. Each step starts when the step
    /// before it has ended and the host has issued it (the host issues the
    /// steps back to back, from 0): `G_k = max(H_k, G_{k−1}) + d_k`, which
    /// unrolls to `D_k + max(0, max_{j≤k} (H_j − D_{j−1}))` — with no host
    /// time, the device's prefix sum. Combined from the largest aligned
    /// range down, a function of the times alone, whatever order they were
    /// set in.
    pub fn end(&self, k: usize) -> f64 {
        let (mut node, mut lo, mut hi) = (1, 0, self.width);
        let mut acc = Span::EMPTY;
        while node < self.width {
            let mid = (lo + hi) / 2;
            if k < mid {
                node *= 2;
                hi = mid;
            } else {
                acc = acc.then(self.tree[2 * node]);
                node = 2 * node + 1;
                lo = mid;
            }
        }
        let acc = acc.then(self.tree[node]);
        acc.d + acc.lead.max(0.0)
    }

    /// When the host has issued every step (forward and backward).
    pub fn host_end(&self) -> f64 {
        self.tree[1].h
    }

    pub fn forward_end(&self) -> f64 {
        let n = self.n_ops();
        if n == 0 {
            0.0
        } else {
            self.end(n - 1)
        }
    }

    pub fn backward_end(&self) -> f64 {
        match self.dur.len() {
            0 => 0.0,
            len => self.end(len - 1),
        }
    }

    /// Start of step `k`.
    pub fn start(&self, k: usize) -> f64 {
        self.end(k) - self.dur[k]
    }
}

/// Steps of op `i`'s input-gradient and weight-gradient kernels.
pub(crate) fn bwd_steps(n: usize, i: usize) -> (usize, usize) {
    let r = n - 1 - i;
    (n + 2 * r, n + 2 * r + 1)
}

/// The replayer for one cluster and one program per device type.
#[derive(Debug, Clone)]
pub struct Simulator {
    pub(crate) cluster: Cluster,
    pub(crate) config: SimConfig,
    pub(crate) timelines: Vec<Timeline>,
    pub(crate) buckets: Vec<Bucket>,
    pub(crate) result: Option<SimResult>,
}

impl Simulator {
    /// Check the input and simulate. `programs[t]` is what every device of
    /// `cluster.types[t]` runs.
    pub fn new(cluster: Cluster, programs: Vec<LocalProgram>, config: SimConfig) -> Result<Simulator, SimError> {
        cluster.validate()?;
        if config.bucket_cap_bytes == 0 {
            return Err(SimError::ZeroBucketCap);
        }
        if programs.len() != cluster.types.len() {
            return Err(SimError::ProgramCount { types: cluster.types.len(), programs: programs.len() });
        }
        for (t, p) in programs.iter().enumerate() {
            check_program(&cluster, t, p)?;
        }
        let grads = grad_sequence(&programs[0]);
        for (t, p) in programs.iter().enumerate().skip(1) {
            check_same_grads(&cluster, t, &grads, p)?;
        }
        let buckets = make_buckets(&cluster, &config, &programs[0]);
        let timelines = programs.into_iter().map(Timeline::new).collect();
        let mut sim = Simulator { cluster, config, timelines, buckets, result: None };
        let r = sim.merge();
        sim.result = Some(r);
        Ok(sim)
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Index of the device type called `name`.
    pub fn device_index(&self, name: &str) -> Option<usize> {
        self.cluster.types.iter().position(|t| t.name == name)
    }

    /// The program device type `t` runs (with every change applied).
    pub fn program(&self, t: usize) -> Option<&LocalProgram> {
        self.timelines.get(t).map(|tl| &tl.program)
    }

    /// Number of DDP buckets (= collectives per iteration).
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Change op `op` of device type `t`. Its gradient bytes must stay the
    /// same (the buckets are shared by all types); a plan that changes the op
    /// list goes through [`Simulator::set_program`].
    pub fn set_op_cost(&mut self, t: usize, op: usize, cost: OpCost) -> Result<(), SimError> {
        let tl = self.timelines.get_mut(t).ok_or(SimError::NoDevice(t))?;
        let device = &self.cluster.types[t].name;
        let n = tl.program.ops.len();
        let old = tl.program.ops.get(op).ok_or_else(|| SimError::NoOp { device: device.clone(), index: op, len: n })?;
        let name = &old.name;
        check_cost(device, op, name, &cost)?;
        if old.cost.grad_bytes != cost.grad_bytes {
            let (old, new) = (old.cost.grad_bytes, cost.grad_bytes);
            return Err(SimError::GradBytesChanged { device: device.clone(), index: op, op: name.clone(), old, new });
        }
        if old.cost.grad_tensors != cost.grad_tensors {
            let (old, new) = (old.cost.grad_tensors, cost.grad_tensors);
            return Err(SimError::GradTensorsChanged { device: device.clone(), index: op, op: name.clone(), old, new });
        }
        let (dg, wg) = bwd_steps(n, op);
        let steps = [(op, cost.fwd_us, cost.host_fwd_us), (dg, cost.input_grad_us, cost.host_bwd_us)];
        for (k, v, h) in steps.into_iter().chain([(wg, cost.weight_grad_us, 0.0)]) {
            if tl.dur[k].to_bits() != v.to_bits() || tl.host[k].to_bits() != h.to_bits() {
                tl.set(k, v, h);
            }
        }
        tl.saved_bytes = tl.saved_bytes - tl.program.ops[op].cost.saved_bytes + cost.saved_bytes;
        tl.program.ops[op].cost = cost;
        self.result = None;
        Ok(())
    }

    /// Change the optimizer step time of device type `t`.
    pub fn set_optimizer_us(&mut self, t: usize, us: f64) -> Result<(), SimError> {
        let tl = self.timelines.get_mut(t).ok_or(SimError::NoDevice(t))?;
        if !us.is_finite() || us < 0.0 {
            let device = self.cluster.types[t].name.clone();
            return Err(SimError::BadNumber { device, what: "optimizer time", value: us });
        }
        tl.program.optimizer_us = us;
        self.result = None;
        Ok(())
    }

    /// Change the memory of device type `t` that does not depend on the
    /// timeline (weights, optimizer state, activations when the caller
    /// estimates the whole peak itself).
    pub fn set_static_memory(&mut self, t: usize, bytes: u64) -> Result<(), SimError> {
        let ty = self.cluster.types.get_mut(t).ok_or(SimError::NoDevice(t))?;
        ty.static_memory_bytes = bytes;
        self.result = None;
        Ok(())
    }

    /// Replace device type `t`'s whole program (e.g. a plan that inserts
    /// casts). Only that type's timeline is rebuilt; it must produce the same
    /// gradients as the others.
    pub fn set_program(&mut self, t: usize, program: LocalProgram) -> Result<(), SimError> {
        if t >= self.timelines.len() {
            return Err(SimError::NoDevice(t));
        }
        check_program(&self.cluster, t, &program)?;
        let reference = if t == 0 { 1 } else { 0 };
        if let Some(other) = self.timelines.get(reference) {
            check_same_grads(&self.cluster, t, &grad_sequence(&other.program), &program)?;
        } else {
            self.buckets = make_buckets(&self.cluster, &self.config, &program);
        }
        self.timelines[t] = Timeline::new(program);
        self.result = None;
        Ok(())
    }

    /// The simulated iteration with every change so far applied.
    pub fn result(&mut self) -> &SimResult {
        let r = match self.result.take() {
            Some(r) => r,
            None => self.merge(),
        };
        self.result.insert(r)
    }

    /// Bring stale timelines up to date and redo the global merge (eq. 6).
    fn merge(&mut self) -> SimResult {
        let mut collectives = Vec::with_capacity(self.buckets.len());
        let mut prev_end = 0.0f64;
        // A synchronization that does not overlap the backward pass (a hook
        // that blocks until its bucket is reduced) holds each type's compute
        // stream from its bucket being ready to the collective's end: every
        // later step starts that much later.
        let blocking = !self.config.sync.path.overlaps(self.config.sync.scheme);
        let mut held = vec![0.0f64; self.timelines.len()];
        // DDP's copies on host cores: each gradient into its bucket as the
        // backward pass produces it (holding the compute stream like any
        // work there), and every bucket back into its gradients once the
        // last collective is done, before the optimizer.
        let mut copy_back = vec![0.0f64; self.timelines.len()];
        // The communication stream's busy time: the collectives as they ran.
        let mut comm_us = 0.0f64;
        // Per type: what the synchronization's CPU work grows by where it
        // interleaves with the backward pass (the same for every bucket).
        let interleave: Vec<f64> =
            (0..self.cluster.types.len()).map(|t| self.cluster.sync_interleave(t, &self.config.sync)).collect();
        for b in &self.buckets {
            for ((h, back), &c) in held.iter_mut().zip(copy_back.iter_mut()).zip(&b.copy_us) {
                *h += c / 2.0;
                *back += c / 2.0;
            }
            let ready_us: Vec<f64> =
                self.timelines.iter().zip(&held).map(|(tl, h)| tl.end(tl.grad_steps[b.last_grad]) + h).collect();
            let start_us = ready_us.iter().fold(prev_end, |a, &r| a.max(r));
            // A type that computes on the host's cores shares them with the
            // synchronization's CPU work. The part of that work done while
            // its backward pass still runs (the collective's time before the
            // backward's end, as a fraction of its length) is shared with
            // the backward: each rank's cores run its backward and its
            // synchronization side by side, each at half speed, so that
            // part delays both the backward and the collective, whose end
            // waits for the type that shared the most. The collective's
            // exchange rounds in that part also wait for their threads to
            // be scheduled behind the backward pass (`wait_us`), which
            // delays the collective alone.
            let mut shared = 0.0f64;
            if !blocking && b.dur_us > 0.0 {
                let per_type = b.cpu_us.iter().zip(&interleave).zip(&b.wait_us);
                for ((h, tl), ((&cpu, &tax), &wait)) in held.iter_mut().zip(&self.timelines).zip(per_type) {
                    if cpu > 0.0 || wait > 0.0 {
                        let left = tl.backward_end() + *h - start_us;
                        let part = (left / b.dur_us).clamp(0.0, 1.0);
                        // Interleaved, the synchronization's threads and the
                        // backward's each refill what the other evicted: the
                        // window both share lasts that much longer.
                        let overlapped = cpu * part * (1.0 + tax);
                        *h += overlapped;
                        shared = shared.max(overlapped + wait * part);
                    }
                }
            }
            let end_us = start_us + b.dur_us + shared;
            comm_us += b.dur_us + shared;
            prev_end = end_us;
            if blocking {
                for (h, r) in held.iter_mut().zip(&ready_us) {
                    *h += end_us - r;
                }
            }
            collectives.push(CollectiveResult { bytes: b.bytes, ready_us, start_us, end_us });
        }
        let mut devices = Vec::with_capacity(self.timelines.len());
        for (((tl, ty), h), back) in self.timelines.iter().zip(&self.cluster.types).zip(&held).zip(&copy_back) {
            let backward_end_us = tl.backward_end() + h;
            // The optimizer's kernels run once the device is free and as
            // fast as the host issues them, which starts once it has issued
            // the backward.
            let finish_us = (backward_end_us.max(prev_end) + back + tl.program.optimizer_us)
                .max(tl.host_end() + tl.program.optimizer_host_us);
            let peak_memory_bytes = ty.static_memory_bytes + tl.saved_bytes;
            devices.push(DeviceResult {
                name: ty.name.clone(),
                count: ty.count(),
                compute_us: tl.backward_end() + tl.program.optimizer_us,
                comm_us,
                idle_us: 0.0,
                forward_end_us: tl.forward_end(),
                backward_end_us,
                finish_us,
                peak_memory_bytes,
                memory_capacity_bytes: ty.memory_capacity_bytes,
                fits: ty.memory_capacity_bytes.is_none_or(|c| peak_memory_bytes <= c),
            });
        }
        let iteration_us = devices.iter().fold(0.0f64, |a, d| a.max(d.finish_us));
        for d in &mut devices {
            d.idle_us = iteration_us - d.compute_us;
        }
        let global_batch = self.cluster.global_batch();
        let samples_per_s = if iteration_us > 0.0 { global_batch as f64 / (iteration_us * 1e-6) } else { 0.0 };
        SimResult {
            iteration_us,
            samples_per_s,
            global_batch,
            allreduce_bytes: self.buckets.iter().map(|b| b.bytes).sum(),
            devices,
            collectives,
        }
    }
}

fn check_cost(device: &str, index: usize, op: &str, c: &OpCost) -> Result<(), SimError> {
    for (what, value) in [
        ("forward time", c.fwd_us),
        ("input-gradient time", c.input_grad_us),
        ("weight-gradient time", c.weight_grad_us),
        ("forward host time", c.host_fwd_us),
        ("backward host time", c.host_bwd_us),
    ] {
        if !value.is_finite() || value < 0.0 {
            return Err(SimError::BadCost { device: device.to_string(), index, op: op.to_string(), what, value });
        }
    }
    Ok(())
}

fn check_program(cluster: &Cluster, t: usize, p: &LocalProgram) -> Result<(), SimError> {
    let device = &cluster.types[t].name;
    for (i, op) in p.ops.iter().enumerate() {
        check_cost(device, i, &op.name, &op.cost)?;
    }
    for (what, value) in [("optimizer time", p.optimizer_us), ("optimizer host time", p.optimizer_host_us)] {
        if !value.is_finite() || value < 0.0 {
            return Err(SimError::BadNumber { device: device.clone(), what, value });
        }
    }
    Ok(())
}

/// Gradient sizes in production (backward) order.
fn grad_sequence(p: &LocalProgram) -> Vec<u64> {
    p.ops.iter().rev().map(|o| o.cost.grad_bytes).filter(|&b| b > 0).collect()
}

fn check_same_grads(cluster: &Cluster, t: usize, reference: &[u64], p: &LocalProgram) -> Result<(), SimError> {
    let found = grad_sequence(p);
    if found == reference {
        return Ok(());
    }
    let ref_t = if t == 0 { 1 } else { 0 };
    Err(SimError::MismatchedGradients {
        device: cluster.types[t].name.clone(),
        reference: cluster.types[ref_t].name.clone(),
        found: found.len(),
        found_bytes: found.iter().sum(),
        expected: reference.len(),
        expected_bytes: reference.iter().sum(),
    })
}

/// DDP bucketing: take gradients in production order, close a bucket as soon
/// as it holds at least the capacity, and close the last one at the end.
/// The gradients are `program`'s ([`grad_sequence`]'s order), each with its
/// parameter tensors (DDP's work per tensor).
fn make_buckets(cluster: &Cluster, config: &SimConfig, program: &LocalProgram) -> Vec<Bucket> {
    let grads: Vec<&OpCost> = program.ops.iter().rev().map(|o| &o.cost).filter(|c| c.grad_bytes > 0).collect();
    let mut buckets = Vec::new();
    let (mut bytes, mut held) = (0u64, 0u64);
    for (k, g) in grads.iter().enumerate() {
        bytes += g.grad_bytes;
        held += g.grad_tensors;
        if bytes >= config.bucket_cap_bytes || k + 1 == grads.len() {
            // A type's synchronization of the bucket, and what its DDP
            // hook adds to it (on host cores, under a compressed scheme).
            let (times, cpu_us): (Vec<f64>, Vec<f64>) = (0..cluster.types.len())
                .map(|t| {
                    let (us, cpu) = cluster.sync_us_and_cpu(t, bytes, &config.sync, config.algo);
                    (us + cluster.hook_us(t, &config.sync), cpu)
                })
                .unzip();
            let dur_us = times.into_iter().fold(0.0f64, f64::max);
            let copy_us = (0..cluster.types.len()).map(|t| cluster.bucket_copy_us(t, bytes, held)).collect();
            let wait_us = (0..cluster.types.len()).map(|t| cluster.sync_busy_wait_us(t, bytes, &config.sync)).collect();
            buckets.push(Bucket { bytes, last_grad: k, dur_us, cpu_us, copy_us, wait_us });
            (bytes, held) = (0, 0);
        }
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalOp;

    fn program(durs: &[(f64, f64, f64)]) -> LocalProgram {
        let ops = durs
            .iter()
            .enumerate()
            .map(|(i, &(f, d, w))| LocalOp {
                name: format!("op{i}"),
                node: None,
                cost: OpCost { fwd_us: f, input_grad_us: d, weight_grad_us: w, ..OpCost::default() },
            })
            .collect();
        LocalProgram { ops, optimizer_us: 0.0, optimizer_host_us: 0.0 }
    }

    /// Durations of awkward magnitudes, so that rounding differs between
    /// summation orders.
    fn durs(n: usize, salt: u64) -> Vec<(f64, f64, f64)> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ salt;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64 * 1e3 + 1e-3
        };
        (0..n).map(|_| (next(), next(), next())).collect()
    }

    #[test]
    fn a_blocking_hook_holds_the_backward_pass() {
        // Two ops, 10 µs per step, 1 MB of gradient each, one bucket per
        // gradient: bucket 0 (op1's) is ready at 40 µs, bucket 1 (op0's) at
        // 60 µs; each takes d µs. Overlapped: bucket 0 runs 40..40+d, bucket 1
        // max(60, 40+d)..+d. Blocking: op0's backward waits for bucket 0, so
        // bucket 1 is ready at 60+d and ends at 60+2d.
        let op = |n: &str| LocalOp { name: n.into(), node: None, cost: OpCost::weighted(10.0, 10.0, 10.0, 1_000_000) };
        let program = LocalProgram { ops: vec![op("op0"), op("op1")], optimizer_us: 5.0, optimizer_host_us: 0.0 };
        let cluster = Cluster::new(vec![crate::DeviceType::new("a", 4, 2, 1).with_bandwidth(10.0, 1.0)]);
        let at = |path| {
            let spec = crate::SyncSpec::new(crate::SyncScheme::Fp16, 512).with_path(path);
            let config = SimConfig { bucket_cap_bytes: 1, sync: spec, ..SimConfig::default() };
            let d = cluster.sync_us(0, 1_000_000, &spec, config.algo);
            let mut sim = Simulator::new(cluster.clone(), vec![program.clone()], config).expect("sim");
            (d, sim.result().clone())
        };
        let (d, r) = at(crate::SyncPath::Host);
        assert!(d > 20.0, "{d} {:?}", r.collectives);
        // The same sums in another order: equal to rounding.
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b;
        assert!(near(r.collectives[1].end_us, 40.0 + 2.0 * d), "{d} {:?}", r.collectives);
        assert!(near(r.iteration_us, 40.0 + 2.0 * d + 5.0), "{} {d}", r.iteration_us);
        let (d, r) = at(crate::SyncPath::HostStaged);
        assert_eq!(r.collectives[1].ready_us, vec![60.0 + d]);
        // The autograd thread returns from the last hook at its end.
        assert_eq!(r.devices[0].backward_end_us, 60.0 + 2.0 * d);
        assert_eq!(r.iteration_us, 60.0 + 2.0 * d + 5.0);
    }

    /// Two ops of 10 ms a step and 1 MB of gradient each, a bucket each,
    /// on 2 nodes × 2 ranks sharing one core a node (NIC 1 GB/s, 10 µs),
    /// host kernels `k`; the device the host's own cores or not.
    fn two_buckets_on_shared_cores(k: crate::SyncKernels, on_host: bool) -> SimResult {
        two_buckets_on_shared_cores_under(k, on_host, crate::SyncSpec::default())
    }

    fn two_buckets_on_shared_cores_under(k: crate::SyncKernels, on_host: bool, sync: crate::SyncSpec) -> SimResult {
        two_buckets_of_tensors(k, on_host, sync, 0).result().clone()
    }

    /// The simulator of the two buckets above, each op's gradient
    /// belonging to `tensors` parameter tensors.
    fn two_buckets_of_tensors(k: crate::SyncKernels, on_host: bool, sync: crate::SyncSpec, tensors: u64) -> Simulator {
        let op = |n: &str| LocalOp {
            name: n.into(),
            node: None,
            cost: OpCost::weighted(10_000.0, 10_000.0, 10_000.0, 1_000_000).with_tensors(tensors),
        };
        let program = LocalProgram { ops: vec![op("op0"), op("op1")], optimizer_us: 5.0, optimizer_host_us: 0.0 };
        let ty = crate::DeviceType::new("cpu", 4, 2, 1)
            .with_bandwidth(10.0, 1.0)
            .with_host(k, 10.0)
            .with_host_cores(Some(1))
            .with_compute_on_host(on_host);
        let config = SimConfig { bucket_cap_bytes: 1, sync, ..SimConfig::default() };
        Simulator::new(Cluster::new(vec![ty]), vec![program], config).expect("sim")
    }

    #[test]
    fn the_hook_adds_its_own_time_to_every_bucket() {
        // The two buckets above under fp16 on the host path, the hook's
        // machinery at 300 µs a bucket: each collective lasts 300 µs more,
        // the first one's beside the backward pass (which it does not
        // delay: it is time, not CPU work), the last one's after it, so the
        // iteration ends 300 µs later. fp32 is DDP's own all-reduce: no
        // hook. On a GPU's cores nothing is added (not measured there).
        let k = crate::SyncKernels { tcp_r: Some(1e-9), cast16_r: 1e-9, ..crate::SyncKernels::default() };
        let hooked = crate::SyncKernels { hook_call_s: Some(3e-4), ..k };
        let fp16 = crate::SyncSpec::new(crate::SyncScheme::Fp16, 512).with_path(crate::SyncPath::Host);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let (a, b) =
            (two_buckets_on_shared_cores_under(k, true, fp16), two_buckets_on_shared_cores_under(hooked, true, fp16));
        for (x, y) in a.collectives.iter().zip(&b.collectives) {
            assert!(near(y.end_us - y.start_us, x.end_us - x.start_us + 300.0), "{x:?} {y:?}");
        }
        assert!(near(b.devices[0].backward_end_us, a.devices[0].backward_end_us), "{:?}", b.devices);
        assert!(near(b.iteration_us, a.iteration_us + 300.0), "{} {}", a.iteration_us, b.iteration_us);
        let fp32 = crate::SyncSpec::default();
        assert_eq!(
            two_buckets_on_shared_cores_under(hooked, true, fp32).collectives,
            two_buckets_on_shared_cores_under(k, true, fp32).collectives
        );
        assert_eq!(
            two_buckets_on_shared_cores_under(hooked, false, fp16).collectives,
            two_buckets_on_shared_cores_under(k, false, fp16).collectives
        );
    }

    #[test]
    fn synchronization_on_the_compute_cores_delays_the_backward_pass() {
        // 2 nodes × 2 CPU ranks, one core a node (share 2), NIC 1 GB/s =
        // 1e3 B/µs, TCP 1 ns a byte, sum 1 ns an element. Two ops, 10 ms a
        // step, 1 MB of gradient each, a bucket each: ready at 40 ms and 60 ms.
        // fp32 is gloo's flat ring: 250 KB a step, link 250 µs, CPU
        // 2.5e5·1e-9·2 = 500 µs, 6 steps of 500 + 20 = 3120 µs, 3 sums of
        // 62 500 elements: 3·125 = 375; a bucket lasts 3495 µs. Its CPU work:
        // TCP on 1.5e6 B and sums of 1.875e5 elements, twice: 3375 µs.
        // Bucket 0 starts at 40 000, inside the backward pass, which shares
        // the core with it: both are 3375 µs late. Bucket 0 ends at
        // 40 000 + 3495 + 3375 = 46 870, the backward at 63 375, when bucket
        // 1 is ready; it starts after the backward and ends on time, at
        // 66 870, and the optimizer's 5 µs follow.
        let k = crate::SyncKernels { tcp_r: Some(1e-9), sum_r: Some(1e-9), ..crate::SyncKernels::default() };
        let run = |on_host: bool| two_buckets_on_shared_cores(k, on_host);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let r = run(true);
        assert!(near(r.collectives[0].end_us - r.collectives[0].start_us, 6870.0), "{:?}", r.collectives);
        assert!(near(r.devices[0].backward_end_us, 63_375.0), "{:?}", r.devices);
        assert!(near(r.collectives[1].end_us - r.collectives[1].start_us, 3495.0), "{:?}", r.collectives);
        // The communication stream was busy for both spans.
        assert!(near(r.devices[0].comm_us, 6870.0 + 3495.0), "{:?}", r.devices);
        assert!(near(r.collectives[1].start_us, 63_375.0), "{:?}", r.collectives);
        assert!(near(r.iteration_us, 66_875.0), "{}", r.iteration_us);
        // The same cores, described as a GPU's: the synchronization costs them
        // nothing and the backward ends on time.
        let g = run(false);
        assert!(near(g.devices[0].backward_end_us, 60_000.0), "{:?}", g.devices);
    }

    #[test]
    fn exchange_rounds_beside_the_backward_pass_wait_to_be_scheduled() {
        // As above, each exchange round waiting 100 µs more while the
        // backward pass computes. gloo's ring has 6 rounds: 600 µs. Bucket
        // 0 runs wholly beside the backward: 40 000 + 3495 + 3375 + 600 =
        // 47 470. The backward is late by the shared CPU work alone (63 375);
        // bucket 1 starts after it, waits for nothing and ends at 66 870.
        let k = crate::SyncKernels {
            tcp_r: Some(1e-9),
            sum_r: Some(1e-9),
            busy_round_s: Some(1e-4),
            ..crate::SyncKernels::default()
        };
        let run = |on_host: bool| two_buckets_on_shared_cores(k, on_host);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let r = run(true);
        assert!(near(r.collectives[0].end_us, 47_470.0), "{:?}", r.collectives);
        assert!(near(r.devices[0].backward_end_us, 63_375.0), "{:?}", r.devices);
        assert!(near(r.collectives[1].end_us, 66_870.0), "{:?}", r.collectives);
        assert!(near(r.devices[0].comm_us, 7470.0 + 3495.0), "{:?}", r.devices);
        assert!(near(r.iteration_us, 66_875.0), "{}", r.iteration_us);
        // On a GPU nothing shares its cores and nothing waits.
        let g = run(false);
        let without = two_buckets_on_shared_cores(crate::SyncKernels { busy_round_s: None, ..k }, false);
        assert_eq!(g.collectives, without.collectives);
    }

    #[test]
    fn interleaving_with_the_backward_pass_costs_both_more() {
        // As above, the synchronization's CPU work and the backward's growing
        // by 0.4 of the former where they interleave on the core: bucket
        // 0's 3375 µs of shared work become 3375·1.4 = 4725, which delay the
        // backward and the collective alike. Bucket 0 ends at 40 000 + 3495 +
        // 4725 = 48 220, the backward at 64 725, when bucket 1 is ready; it
        // runs after the backward, alone on the core, at its own price:
        // 64 725 + 3495 = 68 220, and the optimizer's 5 µs follow.
        let k = crate::SyncKernels {
            tcp_r: Some(1e-9),
            sum_r: Some(1e-9),
            interleave_r: Some(0.4),
            ..crate::SyncKernels::default()
        };
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let r = two_buckets_on_shared_cores(k, true);
        assert!(near(r.collectives[0].end_us, 48_220.0), "{:?}", r.collectives);
        assert!(near(r.devices[0].backward_end_us, 64_725.0), "{:?}", r.devices);
        assert!(near(r.collectives[1].end_us - r.collectives[1].start_us, 3495.0), "{:?}", r.collectives);
        assert!(near(r.iteration_us, 68_225.0), "{}", r.iteration_us);
        // On a GPU's cores nothing interleaves with the backward pass.
        let without = crate::SyncKernels { interleave_r: None, ..k };
        assert_eq!(two_buckets_on_shared_cores(k, false), two_buckets_on_shared_cores(without, false));
    }

    #[test]
    fn ddp_copies_its_buckets_on_the_compute_cores() {
        // As above, with DDP's copies at 2 ns a gradient element (into the
        // bucket and back): a bucket of 1 MB is 2.5e5 elements, 500 µs of
        // CPU, 1000 µs on a core 2 ranks share; half of it as the gradient
        // enters its bucket, half after the last collective.
        // Bucket 0: ready at 40 000 + 500, runs 40 500..47 370 beside the
        // backward, delaying it by its 3375 µs of CPU as before: it ends at
        // 60 000 + 500 + 500 + 3375 = 64 375, bucket 1 is ready then and
        // ends at 67 870; the two copies back (1000 µs) and the optimizer's
        // 5 µs follow: 68 875.
        let k = crate::SyncKernels {
            tcp_r: Some(1e-9),
            sum_r: Some(1e-9),
            bucket_r: Some(2e-9),
            ..crate::SyncKernels::default()
        };
        let run = |on_host: bool| two_buckets_on_shared_cores(k, on_host);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let r = run(true);
        assert!(near(r.collectives[0].ready_us[0], 40_500.0), "{:?}", r.collectives);
        assert!(near(r.devices[0].backward_end_us, 64_375.0), "{:?}", r.devices);
        assert!(near(r.collectives[1].end_us, 67_870.0), "{:?}", r.collectives);
        assert!(near(r.iteration_us, 68_875.0), "{}", r.iteration_us);
        // On a GPU the copies are the device's: nothing on the host cores.
        let g = run(false);
        assert!(near(g.devices[0].backward_end_us, 60_000.0), "{:?}", g.devices);
    }

    #[test]
    fn ddp_works_per_parameter_tensor_on_the_compute_cores() {
        // The buckets of the test above, each op's gradient now of 2
        // parameter tensors, DDP's copies free and its work 250 µs of CPU a
        // tensor: 500 µs a bucket, as the copies cost there, so the same
        // hand-worked times (backward 64 375, iteration 68 875).
        let k = crate::SyncKernels {
            tcp_r: Some(1e-9),
            sum_r: Some(1e-9),
            bucket_tensor_s: Some(2.5e-4),
            ..crate::SyncKernels::default()
        };
        let fp32 = crate::SyncSpec::default();
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let mut sim = two_buckets_of_tensors(k, true, fp32, 2);
        let r = sim.result().clone();
        assert!(near(r.collectives[0].ready_us[0], 40_500.0), "{:?}", r.collectives);
        assert!(near(r.devices[0].backward_end_us, 64_375.0), "{:?}", r.devices);
        assert!(near(r.iteration_us, 68_875.0), "{}", r.iteration_us);
        // Gradients of no known tensor cost nothing a tensor: the times
        // without DDP's work (bucket 0 ready at the end of its gradient).
        let none = two_buckets_of_tensors(k, true, fp32, 0).result().clone();
        assert!(near(none.collectives[0].ready_us[0], 40_000.0), "{:?}", none.collectives);
        assert!(none.iteration_us < r.iteration_us - 1_000.0, "{} vs {}", none.iteration_us, r.iteration_us);
        // A change of an op's cost may not change its tensors (the buckets
        // were built from them).
        let cost = OpCost::weighted(10_000.0, 10_000.0, 10_000.0, 1_000_000).with_tensors(3);
        let e = sim.set_op_cost(0, 1, cost).expect_err("tensors changed");
        assert!(e.to_string().contains("parameter tensors") && e.to_string().contains("2 -> 3"), "{e}");
    }

    #[test]
    fn step_ends_are_prefix_sums() {
        for n in [1, 2, 3, 5, 8, 37] {
            let tl = Timeline::new(program(&durs(n, n as u64)));
            let mut acc = 0.0;
            for k in 0..tl.dur.len() {
                acc += tl.dur[k];
                let e = tl.end(k);
                assert!((e - acc).abs() <= 1e-9 * acc, "n {n}, step {k}: {e} vs {acc}");
                assert!(tl.start(k) >= -1e-9 && tl.start(k) <= e);
            }
            assert!((tl.backward_end() - acc).abs() <= 1e-9 * acc);
            assert_eq!(tl.backward_end().to_bits(), tl.end(tl.dur.len() - 1).to_bits());
        }
    }

    #[test]
    fn edits_in_any_order_equal_a_fresh_timeline() {
        let (a, b) = (durs(29, 1), durs(29, 2));
        let mut edited = Timeline::new(program(&a));
        // Walk to `b` in a scrambled order, with detours through other values.
        let n = a.len();
        for i in (0..n).map(|i| (i * 11) % n) {
            let (dg, wg) = bwd_steps(n, i);
            edited.set(i, a[i].0 * 3.0, 0.0);
            edited.set(wg, b[i].2, 0.0);
            edited.set(i, b[i].0, 0.0);
            edited.set(dg, b[i].1, 0.0);
        }
        let fresh = Timeline::new(program(&b));
        for k in 0..fresh.dur.len() {
            assert_eq!(edited.end(k).to_bits(), fresh.end(k).to_bits(), "step {k}");
        }
        assert_eq!(edited.backward_end().to_bits(), fresh.backward_end().to_bits());
    }

    #[test]
    fn a_kernel_waits_for_the_host_to_issue_it() {
        // op0: 10 µs of kernels the host takes 30 µs to issue; op1: 50 µs
        // issued in 5. By hand: op0 runs 30..40; op1 is issued at 35 and
        // starts when op0 ends, 40..90. The optimizer's 5 µs of kernels take
        // the host 100 µs to issue from 35 (the backward has no work here):
        // the step ends at 135, not 95.
        let host = |mut p: LocalProgram, h0: f64| {
            p.ops[0].cost.host_fwd_us = h0;
            p.ops[1].cost.host_fwd_us = 5.0;
            p.optimizer_us = 5.0;
            p.optimizer_host_us = 100.0;
            p
        };
        let p = host(program(&[(10.0, 0.0, 0.0), (50.0, 0.0, 0.0)]), 30.0);
        let tl = Timeline::new(p.clone());
        assert_eq!((tl.start(0), tl.end(0), tl.start(1), tl.end(1)), (30.0, 40.0, 40.0, 90.0));
        assert_eq!((tl.forward_end(), tl.backward_end(), tl.host_end()), (90.0, 90.0, 35.0));
        let cluster = || Cluster::new(vec![crate::DeviceType::new("h100", 1, 1, 1)]);
        let mut sim = Simulator::new(cluster(), vec![p], SimConfig::default()).expect("valid");
        assert_eq!(sim.result().iteration_us, 135.0);
        // A host that is never behind gives the device's sum, 60 + 5.
        let plain = program(&[(10.0, 0.0, 0.0), (50.0, 0.0, 0.0)]);
        let plain = LocalProgram { optimizer_us: 5.0, ..plain };
        let mut fresh = Simulator::new(cluster(), vec![plain], SimConfig::default()).expect("valid");
        assert_eq!(fresh.result().iteration_us, 65.0);
        // op0 issued at once: op1 is issued at 5, waits for op0 (0..10) and
        // runs 10..60; the optimizer is issued by 105. Edited equals fresh.
        let mut c = sim.program(0).expect("type 0").ops[0].cost;
        c.host_fwd_us = 0.0;
        sim.set_op_cost(0, 0, c).expect("same gradients");
        let fresh = Simulator::new(cluster(), vec![sim.program(0).expect("type 0").clone()], SimConfig::default());
        assert_eq!(sim.result().iteration_us, 105.0);
        assert_eq!(fresh.expect("valid").result().iteration_us.to_bits(), sim.result().iteration_us.to_bits());
        // op1's backward (1 + 1 µs of kernels) takes the host 40 µs to
        // issue, 35..75: its kernels still wait for op1's forward, 90..92.
        let mut p = host(program(&[(10.0, 0.0, 0.0), (50.0, 1.0, 1.0)]), 30.0);
        p.ops[1].cost.host_bwd_us = 40.0;
        let tl = Timeline::new(p);
        let (dg, wg) = bwd_steps(2, 1);
        assert_eq!((tl.start(dg), tl.end(wg), tl.host_end()), (90.0, 92.0, 75.0));
    }
}
