//! What routing knows of each agent beyond its heartbeat (docs/routing.md, "Latency and
//! health"): how fast it has been lately per task type (a peak-EWMA of its task latencies), and
//! whether it is in rotation (a breaker that a run of the agent's own failures opens for a
//! cool-off, then closes after one probe task succeeds).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a latency takes to fade: an estimate decays by `1/e` every this many milliseconds
/// without a slower observation.
pub const DECAY_MS: f64 = 10_000.0;

/// Time as routing sees it, in milliseconds: the system's monotonic clock, or one a simulation
/// sets ([`Clock::manual`]).
#[derive(Debug, Clone)]
pub enum Clock {
    System(Instant),
    Manual(Arc<AtomicU64>),
}

impl Default for Clock {
    fn default() -> Self {
        Clock::System(Instant::now())
    }
}

impl Clock {
    /// A clock that reads what `now` holds (milliseconds), for a simulation.
    pub fn manual(now: Arc<AtomicU64>) -> Clock {
        Clock::Manual(now)
    }

    pub fn now_ms(&self) -> u64 {
        match self {
            // From a point before any agent was seen, so no reading is 0.
            Clock::System(origin) => origin.elapsed().as_millis() as u64 + 1,
            Clock::Manual(now) => now.load(Ordering::Relaxed),
        }
    }
}

/// When agents leave rotation and come back.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSettings {
    /// The agent's own failures in a row (`INTERNAL`) that take it out of rotation.
    pub failures_to_cool_off: u32,
    /// The first cool-off; each failed probe doubles it, up to `max_cool_off`.
    pub cool_off: Duration,
    pub max_cool_off: Duration,
    /// A probe with no result for this long is given up, and another one may go.
    pub probe_timeout: Duration,
    /// An agent whose last heartbeat is older than this many of its heartbeat periods is left
    /// out until its next one (the TTL removes it later).
    pub late_heartbeats: u32,
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            failures_to_cool_off: 3,
            cool_off: Duration::from_secs(5),
            max_cool_off: Duration::from_secs(60),
            probe_timeout: Duration::from_secs(30),
            late_heartbeats: 2,
        }
    }
}

/// How a task ended, for routing's view of the agent that ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// The agent's own failure (`INTERNAL`: a crashed worker, a bug), not its tool's dependency
    /// or its input.
    AgentFault,
    /// Any other failure: the tool's, its dependency's, the input's. Says nothing of the agent.
    OtherFailure,
}

impl Outcome {
    /// The outcome a result with `status` and error `code` (as the wire names it) stands for.
    pub fn of(succeeded: bool, code: &str) -> Outcome {
        match (succeeded, code) {
            (true, _) => Outcome::Succeeded,
            (false, "INTERNAL") => Outcome::AgentFault,
            (false, _) => Outcome::OtherFailure,
        }
    }
}

/// A peak-EWMA: a slower observation is taken at once, a faster one pulls the estimate down as
/// time passes, and with no observations it fades toward zero, so an agent left alone after a
/// slow spell is tried again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeakEwma {
    estimate_ms: f64,
    at_ms: u64,
}

impl PeakEwma {
    pub fn new(first_ms: f64, now_ms: u64) -> Self {
        Self { estimate_ms: first_ms, at_ms: now_ms }
    }

    fn decay(&self, now_ms: u64) -> f64 {
        (-(now_ms.saturating_sub(self.at_ms) as f64) / DECAY_MS).exp()
    }

    /// The estimate at `now_ms`.
    pub fn read(&self, now_ms: u64) -> f64 {
        self.estimate_ms * self.decay(now_ms)
    }

    pub fn observe(&mut self, rtt_ms: f64, now_ms: u64) {
        let decay = self.decay(now_ms);
        let current = self.estimate_ms * decay;
        self.estimate_ms = if rtt_ms > current { rtt_ms } else { current + rtt_ms * (1.0 - decay) };
        self.at_ms = now_ms.max(self.at_ms);
    }
}

/// An agent's place in rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breaker {
    /// In rotation; `failures` of its own in a row so far.
    Closed { failures: u32 },
    /// Out of rotation until `until_ms`.
    CoolingOff { until_ms: u64, cool_off_ms: u64 },
    /// Its cool-off is over: one task goes to it as a probe (`sent_ms` once it went), and its
    /// result decides.
    Probing { sent_ms: Option<u64>, cool_off_ms: u64 },
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker::Closed { failures: 0 }
    }
}

impl Breaker {
    /// Whether a task may go to the agent now; a cool-off that is over becomes a probe.
    pub fn admits(&mut self, now_ms: u64, settings: &HealthSettings) -> bool {
        match *self {
            Breaker::Closed { .. } => true,
            Breaker::CoolingOff { until_ms, cool_off_ms } if now_ms >= until_ms => {
                *self = Breaker::Probing { sent_ms: None, cool_off_ms };
                true
            }
            Breaker::CoolingOff { .. } => false,
            Breaker::Probing { sent_ms: None, .. } => true,
            Breaker::Probing { sent_ms: Some(sent), .. } => {
                now_ms.saturating_sub(sent) >= settings.probe_timeout.as_millis() as u64
            }
        }
    }

    /// A task was routed to the agent.
    pub fn routed(&mut self, now_ms: u64) {
        if let Breaker::Probing { sent_ms, .. } = self {
            *sent_ms = Some(now_ms);
        }
    }

    /// A task the agent ran ended so.
    pub fn observe(&mut self, outcome: Outcome, now_ms: u64, settings: &HealthSettings) {
        let base = settings.cool_off.as_millis() as u64;
        let max = settings.max_cool_off.as_millis() as u64;
        *self = match (*self, outcome) {
            (Breaker::Closed { failures }, Outcome::AgentFault) => {
                let failures = failures + 1;
                if failures >= settings.failures_to_cool_off.max(1) {
                    Breaker::CoolingOff { until_ms: now_ms + base, cool_off_ms: base }
                } else {
                    Breaker::Closed { failures }
                }
            }
            (Breaker::Closed { .. }, Outcome::Succeeded) => Breaker::Closed { failures: 0 },
            (closed @ Breaker::Closed { .. }, Outcome::OtherFailure) => closed,
            // Results of tasks sent before it cooled off change nothing. One that ends after the
            // cool-off decides as a probe's would: a view that does not route (the registry
            // service's, or a dispatcher's whose replica sibling sent the probe) learns so.
            (cooling @ Breaker::CoolingOff { until_ms, .. }, _) if now_ms < until_ms => cooling,
            (Breaker::CoolingOff { cool_off_ms, .. }, Outcome::AgentFault) => {
                let next = (cool_off_ms * 2).min(max).max(base);
                Breaker::CoolingOff { until_ms: now_ms + next, cool_off_ms: next }
            }
            (Breaker::CoolingOff { .. }, Outcome::OtherFailure) => *self,
            (Breaker::CoolingOff { .. }, Outcome::Succeeded) => Breaker::Closed { failures: 0 },
            (Breaker::Probing { cool_off_ms, .. }, Outcome::AgentFault) => {
                let next = (cool_off_ms * 2).min(max).max(base);
                Breaker::CoolingOff { until_ms: now_ms + next, cool_off_ms: next }
            }
            (Breaker::Probing { .. }, _) => Breaker::Closed { failures: 0 },
        };
    }

    /// How `hermes agents` names it at `now_ms`: a cool-off that is over waits for its probe.
    pub fn name(&self, now_ms: u64) -> &'static str {
        match self {
            Breaker::Closed { .. } => "ok",
            Breaker::CoolingOff { until_ms, .. } if now_ms >= *until_ms => "probing",
            Breaker::CoolingOff { .. } => "cool-off",
            Breaker::Probing { .. } => "probing",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_down_is_seen_at_once_and_fades_over_seconds() {
        let mut e = PeakEwma::new(10.0, 0);
        e.observe(10.0, 100);
        assert!((e.read(100) - 10.0).abs() < 0.2);
        e.observe(200.0, 200);
        assert_eq!(e.read(200), 200.0, "a slower task is taken at once");
        // Fast again: within about 10 s the estimate is back near the fast figure.
        for t in 1..=300 {
            e.observe(10.0, 200 + t * 100);
        }
        assert!(e.read(30_200) < 25.0, "{}", e.read(30_200));
        // Left alone, it fades toward zero.
        assert!(e.read(100_000) < 1.0);
    }

    #[test]
    fn own_failures_cool_an_agent_off_and_one_probe_brings_it_back() {
        let s = HealthSettings::default();
        let mut b = Breaker::default();
        b.observe(Outcome::AgentFault, 0, &s);
        b.observe(Outcome::OtherFailure, 0, &s);
        b.observe(Outcome::AgentFault, 0, &s);
        assert!(b.admits(0, &s), "two of its own failures are not yet three");
        b.observe(Outcome::AgentFault, 1_000, &s);
        assert_eq!(b, Breaker::CoolingOff { until_ms: 6_000, cool_off_ms: 5_000 });
        assert!(!b.admits(5_999, &s));
        b.observe(Outcome::Succeeded, 5_000, &s);
        assert!(!b.admits(5_999, &s), "a late success of an earlier task does not end the cool-off");
        assert!(b.admits(6_000, &s));
        b.routed(6_000);
        assert!(!b.admits(6_001, &s), "one probe at a time");
        // The probe fails: a cool-off twice as long.
        b.observe(Outcome::AgentFault, 6_500, &s);
        assert_eq!(b, Breaker::CoolingOff { until_ms: 16_500, cool_off_ms: 10_000 });
        assert!(b.admits(16_500, &s));
        b.routed(16_500);
        // A probe that never answers is given up after its timeout.
        assert!(b.admits(16_500 + 30_000, &s));
        b.observe(Outcome::Succeeded, 47_000, &s);
        assert_eq!(b, Breaker::Closed { failures: 0 });
        // A view that never routes learns from results that end after the cool-off.
        let mut view = Breaker::CoolingOff { until_ms: 1_000, cool_off_ms: 5_000 };
        assert_eq!(view.name(999), "cool-off");
        assert_eq!(view.name(1_000), "probing");
        view.observe(Outcome::AgentFault, 1_000, &s);
        assert_eq!(view, Breaker::CoolingOff { until_ms: 11_000, cool_off_ms: 10_000 });
        view.observe(Outcome::Succeeded, 11_000, &s);
        assert_eq!(view.name(11_000), "ok");
        assert_eq!(Outcome::of(false, "INTERNAL"), Outcome::AgentFault);
        assert_eq!(Outcome::of(false, "UNAVAILABLE"), Outcome::OtherFailure);
    }
}
