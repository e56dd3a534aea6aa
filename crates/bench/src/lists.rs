//! Goal lists: a page of the 100 newest goals through the goal index
//! (`hermes_dispatcher::goal_index`) with 10k and 1M goals indexed (the index's walk alone), the
//! index's memory per goal; then with 10k and 1M goals synthesized into the goals bucket, how long
//! a dispatcher takes to read the index at start (headers only) and a whole page: the walk, then
//! the 100 goals read from the bucket, as `ListGoals` does.

use std::time::Instant;

use hermes_dispatcher::goal_index::{GoalIndex, PageQuery};
use hermes_proto::GoalIndexEntry;
use prost::Message as _;

const TENANTS: usize = 10;
const PAGE: usize = 100;

fn entry(i: usize) -> GoalIndexEntry {
    GoalIndexEntry {
        goal_id: format!("g-{i:012}"),
        tenant: format!("tenant-{}", i % TENANTS),
        // Mostly completed, some running, a few failed: a live system's mix.
        status: match i % 20 {
            3 => 4,
            0..=2 => 2,
            _ => 3,
        },
        created_unix_ms: 1_700_000_000_000 + i as u64,
        session_id: String::new(),
        updated_unix_ms: 1_700_000_000_000 + i as u64,
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// p50 and p99 in microseconds of `queries` pages asked of `index`.
fn page_latency(index: &GoalIndex, queries: usize) -> [(f64, f64); 3] {
    let shapes: [PageQuery<'static>; 3] = [
        PageQuery::default(),
        PageQuery { tenant: Some("tenant-3"), ..Default::default() },
        PageQuery { tenant: Some("tenant-3"), status: Some(4), ..Default::default() },
    ];
    shapes.map(|query| {
        let mut samples: Vec<f64> = (0..queries)
            .map(|_| {
                let start = Instant::now();
                let page = index.page(&query, PAGE);
                let took = start.elapsed().as_secs_f64() * 1e6;
                assert_eq!(page.len(), PAGE, "a full page");
                took
            })
            .collect();
        (crate::percentile(&mut samples, 0.5), crate::percentile(&mut samples, 0.99))
    })
}

/// Prints the rows: `sizes` goals indexed in memory; then, for each of `stored` goals written into
/// the goals bucket, the index's start-up read and whole pages.
pub async fn rows(nats_url: &str, sizes: &[usize], stored: &[usize]) -> anyhow::Result<()> {
    println!(
        "\n{:<58} {:>12} {:>12} {:>9}",
        "goal lists (a page of 100, goal index)", "p50 us", "p99 us", "p50 x"
    );
    let mut first = None;
    for &n in sizes {
        let before = rss_kib();
        let index = GoalIndex::default();
        for i in 0..n {
            index.apply(entry(i), i as u64 + 1);
        }
        let per_goal = (rss_kib().saturating_sub(before) * 1024) as f64 / n as f64;
        let [all, tenant, tenant_status] = page_latency(&index, 200);
        let base = *first.get_or_insert(all.0);
        for (name, (p50, p99)) in
            [("newest", all), ("newest of a tenant", tenant), ("newest failed of a tenant", tenant_status)]
        {
            println!("{:<58} {:>12.1} {:>12.1} {:>8.2}x", format!("{name}, {n} goals"), p50, p99, p50 / base);
        }
        println!("{:<58} {:>12.0}", format!("index memory per goal (bytes, RSS), {n} goals"), per_goal);
    }
    // Stored goals: written into the goals bucket with their index headers, as the goal store
    // writes them; at each size, a dispatcher's start-up read of the index and whole pages (the
    // index's walk, then the 100 goals read from the bucket, 64 at a time, as `ListGoals` does).
    let bus = hermes_core::Bus::connect(hermes_core::BusConfig::new(nats_url)).await?;
    println!(
        "{:<58} {:>12} {:>12} {:>9}",
        "a whole page of 100 (index, then the goals from KV)", "p50 ms", "p99 ms", "p50 x"
    );
    let mut written = 0;
    let mut first = None;
    for &n in stored {
        write_goals(&bus, written, n).await?;
        written = n;
        let stop = tokio_util::sync::CancellationToken::new();
        let start = Instant::now();
        let index = GoalIndex::open(&bus, stop.clone()).await?;
        let read_ms = start.elapsed().as_secs_f64() * 1e3;
        let (p50, p99) = whole_pages(&bus, &index, 50).await?;
        stop.cancel();
        let base = *first.get_or_insert(p50);
        println!(
            "{:<58} {:>12.2} {:>12.2} {:>8.2}x",
            format!("newest, {n} goals stored"),
            p50,
            p99,
            p50 / base
        );
        println!("{:<58} {:>12.0}", format!("index read at start (ms), {} goals", index.len()), read_ms);
    }
    Ok(())
}

/// Writes goals `from..to` into the goals bucket, each with its index headers.
async fn write_goals(bus: &hermes_core::Bus, from: usize, to: usize) -> anyhow::Result<()> {
    let js = bus.jetstream();
    let prefix = bus.goals().prefix.clone();
    let mut acks = Vec::new();
    for i in from..to {
        let entry = entry(i);
        let state = hermes_proto::GoalState {
            goal_id: entry.goal_id.clone(),
            status: entry.status,
            created_unix_ms: entry.created_unix_ms,
            ..Default::default()
        };
        let headers = hermes_dispatcher::goal_index::headers(&entry);
        let subject = format!("{prefix}{}", entry.goal_id);
        acks.push(js.publish_with_headers(subject, headers, state.encode_to_vec().into()).await?);
        if acks.len() == 1000 {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in acks {
        ack.await?;
    }
    Ok(())
}

/// p50 and p99 in milliseconds of `pages` whole pages of the 100 newest goals.
async fn whole_pages(bus: &hermes_core::Bus, index: &GoalIndex, pages: usize) -> anyhow::Result<(f64, f64)> {
    use futures::{StreamExt as _, TryStreamExt as _};
    let goals = bus.goals();
    let mut samples = Vec::with_capacity(pages);
    for _ in 0..pages {
        let start = Instant::now();
        let places = index.page(&PageQuery::default(), PAGE);
        let read: Vec<_> = futures::stream::iter(places)
            .map(|(_, id)| async move { goals.entry(&*id).await })
            .buffered(64)
            .try_collect()
            .await?;
        anyhow::ensure!(read.iter().filter(|e| e.is_some()).count() == PAGE, "a full page of stored goals");
        samples.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok((crate::percentile(&mut samples, 0.5), crate::percentile(&mut samples, 0.99)))
}
