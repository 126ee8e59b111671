//! A small number for each thread, for tables with a slot per worker thread (the gateway's
//! proxy pool, the Redis store's lanes) that a thread reads without a shared lock.

use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
}

/// This thread's number: threads are numbered 0, 1, 2, ... in the order they first ask, and
/// a thread keeps its number. A table of `n` slots takes `thread_index() % n`: the first `n`
/// threads that ask (a gateway's workers, started before they serve) get a slot each, and
/// later ones share.
pub fn thread_index() -> usize {
    INDEX.with(|i| *i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_number_and_another_thread_gets_another() {
        let mine = thread_index();
        assert_eq!(thread_index(), mine);
        let other = std::thread::spawn(thread_index).join().expect("thread");
        assert_ne!(other, mine);
    }
}
