//! Reads a decision rests on come from the goals' stream leader. A replica that was paused
//! answers direct gets (which `GoalStore::load` uses, for views) with the state it had until it
//! has caught up; the results worker once judged a result stale on such a state and dropped it,
//! and the goal hung until its deadline (`make chaos`, scenario 10). `GoalStore::load_current`
//! must never answer with an older state than the last acknowledged write.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use hermes_core::{Bus, BusConfig};
use hermes_dispatcher::goal_index::GoalIndex;
use hermes_dispatcher::store::GoalStore;
use hermes_proto::{GoalState, GoalStatus};
use hermes_test_util::NatsCluster;
use tokio_util::sync::CancellationToken;

async fn store_on(url: String, stop: &CancellationToken) -> GoalStore {
    let mut config = BusConfig::new(url);
    config.replicas = 3;
    let bus = Bus::connect(config).await.expect("bus");
    let index = GoalIndex::open(&bus, stop.clone()).await.expect("goal index");
    GoalStore::new(bus.goals().clone(), bus.jetstream().clone(), 1 << 20, index)
}

fn goal(id: &str, status: GoalStatus) -> GoalState {
    GoalState { goal_id: id.into(), status: status as i32, created_unix_ms: 1, ..Default::default() }
}

/// A goal of 4 KB, so the paused replica has megabytes to catch up on.
fn filler(id: &str) -> GoalState {
    let mut state = goal(id, GoalStatus::Completed);
    state.spec = Some(hermes_proto::GoalSpec { text: "x".repeat(4096), ..Default::default() });
    state
}

/// Freezes server `lagging`, writes `filler` goals and then the watched goal's new state through
/// another server, thaws it and reads the goal through it for two seconds. Returns the revision
/// written and the revisions each read saw: (direct, current).
async fn lag_and_read(
    cluster: &NatsCluster,
    lagging: usize,
    writer: &GoalStore,
    reader: &GoalStore,
    watched: &str,
    fillers: usize,
) -> (u64, Vec<u64>, Vec<u64>) {
    cluster.freeze(lagging);
    let ids: Vec<String> =
        (0..fillers).map(|i| format!("g-filler-{lagging}-{i}-{}", hermes_core::now_unix_ms())).collect();
    futures::stream::iter(&ids)
        .map(|id| async move { writer.create(&filler(id)).await.expect("filler") })
        .buffer_unordered(256)
        .collect::<Vec<_>>()
        .await;
    let written = writer
        .update(watched, |state| {
            state.status = GoalStatus::Completed as i32;
            Some(hermes_dispatcher::engine::Effects::default())
        })
        .await
        .expect("update")
        .expect("changed");
    let (_, revision) = writer.load_current(watched).await.unwrap().unwrap();
    assert_eq!(written.state.status, GoalStatus::Completed as i32);
    cluster.thaw(lagging);
    let (mut direct, mut current) = (Vec::new(), Vec::new());
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        // Side by side, so the leader's answers fall in the window the replica's do.
        let (replica, leader) = tokio::join!(reader.load(watched), reader.load_current(watched));
        if let Ok(Some((_, seen))) = replica {
            direct.push(seen);
        }
        if let Ok(Some((_, seen))) = leader {
            current.push(seen);
        }
    }
    (revision, direct, current)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decision_never_reads_a_lagging_replicas_older_state() {
    let cluster = NatsCluster::start(3);
    let stop = CancellationToken::new();
    let writer = store_on(cluster.url(0), &stop).await;
    writer.create(&goal("g-watched", GoalStatus::Running)).await.expect("create");
    let mut stale_direct = 0;
    for attempt in 0..5 {
        // A follower of the goals' stream: the one the reads go through.
        let leader = {
            let client = async_nats::connect(cluster.url(0)).await.unwrap();
            let js = async_nats::jetstream::new(client);
            let mut stream = js.get_stream("KV_hermes_goals").await.unwrap();
            stream.info().await.unwrap().cluster.clone().unwrap().leader.unwrap()
        };
        let lagging = (1..3).find(|&i| cluster.name(i) != leader).unwrap();
        let reader = store_on(cluster.url(lagging), &stop).await;
        // The watched goal goes back to running for each attempt, so each has a newer write.
        writer
            .update("g-watched", |state| {
                state.status = GoalStatus::Running as i32;
                Some(hermes_dispatcher::engine::Effects::default())
            })
            .await
            .unwrap();
        let (revision, direct, current) =
            lag_and_read(&cluster, lagging, &writer, &reader, "g-watched", 4_000 * (attempt + 1)).await;
        assert!(!current.is_empty(), "the leader never answered");
        let older: Vec<_> = current.iter().filter(|&&seen| seen < revision).collect();
        assert!(older.is_empty(), "load_current answered an older revision than {revision}: {older:?}");
        stale_direct += direct.iter().filter(|&&seen| seen < revision).count();
        if stale_direct > 0 {
            break;
        }
    }
    // Without a lagging answer the test proved nothing: the server would have changed.
    assert!(stale_direct > 0, "no direct get was answered from a lagging replica in 5 tries");
    stop.cancel();
}
