//! The routing simulator (docs/routing.md, "Latency and health"): the registry's own routing
//! (`hermes_registry::Registry::route`), on a clock the simulation moves, sends single-task goals
//! to a fleet of simulated agents of mixed speeds, some of which slow down or start failing on
//! their own mid-run and recover later. Run once with the old policy (capability and free slots,
//! `Policy::Scored`) and once with the new one (`Policy::Balanced`: latency and health), on the
//! same fleet and the same arrivals, it compares goal latency and the tasks sent to sick agents.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hermes_proto::{AgentHeartbeat, RouteQuery};
use hermes_registry::{Clock, Outcome, Policy, Registry, RegistryConfig};

/// The fleet and the run.
#[derive(Debug, Clone, Copy)]
pub struct Fleet {
    pub agents: usize,
    pub slots: u32,
    /// Virtual seconds the arrivals last.
    pub seconds: u64,
    /// Share of the fleet's capacity the arrivals ask for.
    pub utilisation: f64,
}

/// One policy's run.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub goals: usize,
    /// Goals that arrived (the same for every policy).
    pub arrived: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Tasks sent to an agent while it was slowed down or failing.
    pub on_sick: usize,
    /// Tasks sent to an agent the routing view had in a cool-off (must be 0).
    pub in_cool_off: usize,
    /// Attempts that failed on a failing agent and went again.
    pub retried: usize,
}

/// How an agent behaves: its task time, and from when to when it is sick.
struct Agent {
    id: String,
    base_ms: f64,
    /// Slowed down this many times while sick.
    slow_factor: f64,
    /// Fails every task at once (its own failure) while sick.
    failing: bool,
    sick: Option<(u64, u64)>,
    in_flight: u32,
}

impl Agent {
    fn sick_at(&self, t: u64) -> bool {
        self.sick.is_some_and(|(from, to)| t >= from && t < to)
    }
}

/// A small deterministic generator, so both policies see the same fleet and arrivals.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn fleet(f: &Fleet) -> Vec<Agent> {
    let mut rng = Rng(0x5eed_cafe);
    let sick_from = f.seconds * 1000 / 3;
    let sick_to = f.seconds * 1000 * 2 / 3;
    (0..f.agents)
        .map(|i| {
            // Mixed speeds: 100 to 300 ms a task; one agent in ten is ten times slower throughout.
            let mut base_ms = 100.0 + 200.0 * rng.next();
            if i % 10 == 9 {
                base_ms *= 10.0;
            }
            // One in twenty slows down 20 times for the middle third; one in fifty fails then.
            let (slow_factor, failing, sick) = match i % 50 {
                3 | 23 => (20.0, false, Some((sick_from, sick_to))),
                13 => (1.0, true, Some((sick_from, sick_to))),
                _ => (1.0, false, None),
            };
            Agent { id: format!("sim-{i:04}"), base_ms, slow_factor, failing, sick, in_flight: 0 }
        })
        .collect()
}

fn heartbeat(agent: &Agent, slots: u32) -> AgentHeartbeat {
    AgentHeartbeat {
        agent_id: agent.id.clone(),
        task_types: vec!["sim.task".into()],
        max_concurrency: slots,
        in_flight: agent.in_flight,
        heartbeat_period_ms: 5_000,
        ..Default::default()
    }
}

/// A task's attempt ending at its time.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Ending {
    at_us: u64,
    sent_us: u64,
    agent: usize,
    goal: usize,
    failed: bool,
}

/// Runs the fleet's arrivals through `policy`.
pub fn run(f: &Fleet, policy: Policy) -> Run {
    let now = Arc::new(AtomicU64::new(1));
    let registry = Registry::new(RegistryConfig {
        policy,
        clock: Clock::manual(now.clone()),
        seed: 42,
        ..Default::default()
    });
    let mut agents = fleet(f);
    for a in &agents {
        let _ = registry.apply_heartbeat(&a.id, heartbeat(a, f.slots));
    }
    let index: std::collections::HashMap<String, usize> =
        agents.iter().enumerate().map(|(i, a)| (a.id.clone(), i)).collect();
    // Capacity in tasks per ms, at each agent's healthy speed.
    let capacity: f64 = agents.iter().map(|a| f64::from(f.slots) / a.base_ms).sum();
    let gap_us = 1000.0 / (capacity * f.utilisation);
    let end_us = f.seconds * 1_000_000;
    // Arrivals draw from their own generator, so both policies see the same ones.
    let mut rng = Rng(0xa11_7a5c);
    let mut arrivals = Rng(0x0a77_1fa1);
    let query = RouteQuery { task_type: "sim.task".into(), ..Default::default() };
    let mut endings: BinaryHeap<Reverse<Ending>> = BinaryHeap::new();
    let mut waiting: VecDeque<usize> = VecDeque::new();
    let mut arrived: Vec<u64> = Vec::new();
    let mut latencies: Vec<f64> = Vec::new();
    let mut out = Run::default();
    let mut next_arrival = 0.0_f64;
    let mut next_beat = 5_000_000u64;
    // Sends `goal` where routing says, at `t_us`; the pool (every agent saturated) queues it.
    let dispatch = |goal: usize,
                    t_us: u64,
                    agents: &mut Vec<Agent>,
                    endings: &mut BinaryHeap<Reverse<Ending>>,
                    waiting: &mut VecDeque<usize>,
                    out: &mut Run,
                    rng: &mut Rng| {
        let decision = registry.route(&query);
        let Some(&i) = index.get(&decision.agent_id) else {
            waiting.push_back(goal);
            return;
        };
        if registry.health_of(&decision.agent_id) == Some("cool-off") {
            out.in_cool_off += 1;
        }
        let a = &mut agents[i];
        a.in_flight += 1;
        let t_ms = t_us / 1000;
        let sick = a.sick_at(t_ms);
        out.on_sick += usize::from(sick);
        let (ms, failed) = match (sick, a.failing) {
            (true, true) => (1.0, true),
            (true, false) => (a.base_ms * a.slow_factor * (0.8 + 0.4 * rng.next()), false),
            _ => (a.base_ms * (0.8 + 0.4 * rng.next()), false),
        };
        endings.push(Reverse(Ending {
            at_us: t_us + (ms * 1000.0) as u64,
            sent_us: t_us,
            agent: i,
            goal,
            failed,
        }));
    };
    loop {
        let arrival_due = (next_arrival as u64) < end_us;
        let next_end = endings.peek().map(|e| e.0.at_us);
        let t_us = match (arrival_due, next_end) {
            (true, Some(e)) if e < next_arrival as u64 => e,
            (true, _) => next_arrival as u64,
            (false, Some(e)) => e,
            (false, None) => break,
        };
        now.store(t_us / 1000 + 1, Ordering::Relaxed);
        while t_us >= next_beat {
            for a in &agents {
                let _ = registry.apply_heartbeat(&a.id, heartbeat(a, f.slots));
            }
            next_beat += 5_000_000;
        }
        if next_end == Some(t_us) {
            let Reverse(ending) = endings.pop().expect("peeked");
            let a = &mut agents[ending.agent];
            a.in_flight -= 1;
            let started = arrived[ending.goal];
            let outcome = if ending.failed { Outcome::AgentFault } else { Outcome::Succeeded };
            let id = a.id.clone();
            registry.task_finished(&id);
            // The attempt's run time, as the agent's result says it.
            let elapsed = Duration::from_micros(t_us - ending.sent_us);
            registry.observe(&id, "sim.task", elapsed, outcome);
            if ending.failed {
                out.retried += 1;
                dispatch(ending.goal, t_us, &mut agents, &mut endings, &mut waiting, &mut out, &mut rng);
            } else {
                latencies.push((t_us - started) as f64 / 1000.0);
            }
            if let Some(goal) = waiting.pop_front() {
                dispatch(goal, t_us, &mut agents, &mut endings, &mut waiting, &mut out, &mut rng);
            }
        } else {
            let goal = arrived.len();
            arrived.push(t_us);
            dispatch(goal, t_us, &mut agents, &mut endings, &mut waiting, &mut out, &mut rng);
            next_arrival += gap_us * (0.5 + arrivals.next());
        }
    }
    out.goals = latencies.len();
    out.arrived = arrived.len();
    latencies.sort_by(f64::total_cmp);
    let at = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    out.p50_ms = at(0.5);
    out.p99_ms = at(0.99);
    out
}

pub fn rows(f: &Fleet, old: &Run, new: &Run) {
    println!(
        "\n{:<58} {:>12} {:>12} {:>10}",
        format!("routing simulator: {} agents x {} slots, {} s", f.agents, f.slots, f.seconds),
        "balanced",
        "scored (old)",
        "ratio"
    );
    println!("{}", "-".repeat(95));
    let row = |name: &str, new: f64, old: f64| {
        println!("{name:<58} {new:>12.1} {old:>12.1} {:>9.2}x", new / old.max(1e-9));
    };
    row("goal latency p50 (ms)", new.p50_ms, old.p50_ms);
    row("goal latency p99 (ms)", new.p99_ms, old.p99_ms);
    println!("{:<58} {:>12} {:>12}", "tasks sent to sick agents", new.on_sick, old.on_sick);
    println!(
        "{:<58} {:>12} {:>12}",
        "attempts failed on failing agents, sent again", new.retried, old.retried
    );
    println!("{:<58} {:>12} {:>12}", "tasks sent to an agent in cool-off", new.in_cool_off, old.in_cool_off);
    println!(
        "{:<58} {:>12} {:>12}",
        "goals completed (of those that arrived)",
        format!("{}/{}", new.goals, new.arrived),
        format!("{}/{}", old.goals, old.arrived)
    );
    println!(
        "fleet: 100-300 ms a task, one agent in ten 10x slower; for the middle third one in 25 is 20x\n\
         slower and one in 50 fails every task on its own. Arrivals ask for {:.0}% of the capacity.\n\
         targets (docs/routing.md): p99 at least 2x better than the old policy; no task to an agent\n\
         in cool-off.",
        f.utilisation * 100.0
    );
}
