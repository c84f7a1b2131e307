//! Order-preserving parallel map over independent predictions.
//!
//! The planner builds many predictors that read the same graph and nothing
//! of each other; this runs them on the machine's cores. Results come back
//! in the input's order and each item is computed exactly as it would be
//! alone, so plans stay byte-identical whatever the thread count.

/// `f` over `items` on up to `available_parallelism` threads (the calling
/// thread included), results in `items`' order. A panic in `f` resumes on
/// the caller.
pub(crate) fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from).min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    // Strided assignment: item i to worker i % threads.
    let f = &f;
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (1..threads)
            .map(|w| {
                scope.spawn(move || {
                    items.iter().enumerate().skip(w).step_by(threads).map(|(i, x)| (i, f(x))).collect::<Vec<_>>()
                })
            })
            .collect();
        for (i, x) in items.iter().enumerate().step_by(threads) {
            slots[i] = Some(f(x));
        }
        for w in workers {
            for (i, r) in w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)) {
                slots[i] = Some(r);
            }
        }
    });
    slots.into_iter().map(|r| r.expect("every item has a worker")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_order_and_covers_every_item() {
        for n in [0usize, 1, 2, 3, 7, 64] {
            let items: Vec<usize> = (0..n).collect();
            let out = super::map(&items, |&i| i * i + 1);
            assert_eq!(out, items.iter().map(|i| i * i + 1).collect::<Vec<_>>());
        }
    }
}
