//! A cancellation signal shared by a batch and its episodes: set once (ctrl-C, SIGTERM, an
//! error), observed by every episode at each step so that each one removes what it created.

use std::sync::Arc;

use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct Cancel {
    tx: Arc<watch::Sender<bool>>,
    rx: watch::Receiver<bool>,
}

impl Default for Cancel {
    fn default() -> Cancel {
        Cancel::new()
    }
}

impl Cancel {
    pub fn new() -> Cancel {
        let (tx, rx) = watch::channel(false);
        Cancel {
            tx: Arc::new(tx),
            rx,
        }
    }

    pub fn cancel(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_cancelled(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once [`Cancel::cancel`] has been called (immediately if it already was).
    pub async fn cancelled(&self) {
        let mut rx = self.rx.clone();
        // An error means every sender is gone; this holds one, so it cannot happen.
        let _ = rx.wait_for(|c| *c).await;
    }
}

/// Resolves at the next ctrl-C or SIGTERM the process receives (from then on the process
/// handles both itself: whoever waits here decides how it ends).
pub async fn interruption() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wakes_waiters() {
        let c = Cancel::new();
        assert!(!c.is_cancelled());
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.cancelled().await })
        };
        c.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(2), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(c.is_cancelled());
        c.cancelled().await;
    }
}
