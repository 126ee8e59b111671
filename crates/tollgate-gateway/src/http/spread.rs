//! Connections spread over the workers that accept on one listening socket (`runtime.rs`,
//! `serve.rs`). Every worker waiting on the socket is woken by a new connection, and the first
//! to run would take every connection queued (a load balancer's or Envoy's pool opening a
//! few dozen at once lands on one worker, and stays there: a connection never moves). So a
//! worker takes the next connection only while it holds at most [`SLACK`] more than the
//! least loaded worker; the others wait their turn, woken when the counts let them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// How many more open connections than the least loaded worker a worker may hold and still
/// accept: 0 would wake a worker for nearly every connection another one accepts.
pub(crate) const SLACK: usize = 1;

/// Open connections per worker, and a turn signal per worker.
pub(crate) struct Spread {
    open: Box<[AtomicUsize]>,
    turn: Box<[Notify]>,
}

impl Spread {
    /// For `workers` workers (at least one).
    pub(crate) fn new(workers: usize) -> Arc<Self> {
        let n = workers.max(1);
        Arc::new(Self {
            open: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            turn: (0..n).map(|_| Notify::new()).collect(),
        })
    }

    fn least(&self) -> usize {
        self.open
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0)
    }

    /// Whether worker `me` may accept now.
    pub(crate) fn may_accept(&self, me: usize) -> bool {
        let Some(mine) = self.open.get(me) else {
            return true;
        };
        mine.load(Ordering::Relaxed) <= self.least().saturating_add(SLACK)
    }

    /// Returns once worker `me` may accept.
    pub(crate) async fn turn(&self, me: usize) {
        let Some(signal) = self.turn.get(me) else {
            return;
        };
        loop {
            // Registered before the check, so a change between the two is not missed.
            let notified = signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.may_accept(me) {
                return;
            }
            notified.await;
        }
    }

    /// Counts a connection of worker `me` until the guard drops.
    pub(crate) fn opened(self: &Arc<Self>, me: usize) -> Opened {
        if let Some(c) = self.open.get(me) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.wake_eligible();
        Opened {
            spread: Arc::clone(self),
            me,
        }
    }

    /// Gives a turn to every worker the counts now let accept (a worker not waiting keeps
    /// it for its next check, which costs nothing).
    fn wake_eligible(&self) {
        let bound = self.least().saturating_add(SLACK);
        for (c, signal) in self.open.iter().zip(self.turn.iter()) {
            if c.load(Ordering::Relaxed) <= bound {
                signal.notify_one();
            }
        }
    }
}

/// A connection counted against its worker until dropped.
pub(crate) struct Opened {
    spread: Arc<Spread>,
    me: usize,
}

impl Drop for Opened {
    fn drop(&mut self) {
        if let Some(c) = self.spread.open.get(self.me) {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        self.spread.wake_eligible();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_worker_ahead_of_the_least_loaded_waits_and_one_behind_accepts() {
        let s = Spread::new(3);
        assert!((0..3).all(|w| s.may_accept(w)));
        let a: Vec<Opened> = (0..=SLACK).map(|_| s.opened(0)).collect();
        assert!(
            !s.may_accept(0),
            "worker 0 holds SLACK + 1 more than the others"
        );
        assert!(s.may_accept(1) && s.may_accept(2));
        let b = s.opened(1);
        assert!(!s.may_accept(0), "worker 2 still holds none");
        let c = s.opened(2);
        assert!(s.may_accept(0), "the least loaded now holds one");
        drop((b, c));
        assert!(!s.may_accept(0));
        drop(a);
        assert!((0..3).all(|w| s.may_accept(w)));
        // Out of range: never held back.
        assert!(s.may_accept(7));
    }

    #[tokio::test]
    async fn a_waiting_worker_gets_its_turn_when_the_others_catch_up_or_it_sheds_one() {
        let s = Spread::new(2);
        let mine: Vec<Opened> = (0..=SLACK).map(|_| s.opened(0)).collect();
        let waiting = {
            let s = Arc::clone(&s);
            tokio::spawn(async move { s.turn(0).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "worker 0 is ahead: it waits");
        let theirs = s.opened(1);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken when worker 1 caught up")
            .expect("task");

        // Ahead again; this time one of its own connections closes.
        let more = s.opened(0);
        assert!(!s.may_accept(0));
        let waiting = {
            let s = Arc::clone(&s);
            tokio::spawn(async move { s.turn(0).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(more);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken when its own connection closed")
            .expect("task");
        drop((mine, theirs));
    }

    /// A burst of connections offered to workers that all want them ends up spread within
    /// the slack, whatever order the workers run in.
    #[test]
    fn a_burst_taken_greedily_ends_up_spread() {
        let s = Spread::new(4);
        let mut held: Vec<Opened> = Vec::new();
        // Worker 0 runs first and takes all it may; then the others, round after round.
        for _ in 0..64 {
            let w = (0..4)
                .find(|&w| s.may_accept(w))
                .expect("the least loaded may always accept");
            held.push(s.opened(w));
        }
        let counts: Vec<usize> = s.open.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let (lo, hi) = (counts.iter().min(), counts.iter().max());
        assert!(
            hi.zip(lo).is_some_and(|(h, l)| h - l <= SLACK + 1),
            "{counts:?}"
        );
        assert_eq!(counts.iter().sum::<usize>(), 64);
    }
}
