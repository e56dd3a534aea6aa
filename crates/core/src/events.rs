//! How goal events are stored on `hermes.event.<goal_id>`: one message per committed transition,
//! an [`EventBatch`] of its events in `seq` order, so a transition that produces several events
//! (a submit's `GoalAccepted`, `PlanCreated` and `TaskDispatched`s; a result's `TaskSucceeded` and
//! `GoalCompleted`) costs one stored message, not one each. A transition whose events are over
//! [`MAX_BATCH_BYTES`] (a plan of thousands of nodes) takes several messages, in order.
//!
//! Every reader of the events stream decodes with [`decode`], which also reads a message stored
//! before events were batched (one bare `Event`).

use std::borrow::Cow;

use bytes::Bytes;
use hermes_proto::{Event, EventBatch};
use prost::Message as _;

/// Most bytes of events one message carries (an event over it goes alone).
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

/// `EventBatch.events`'s field number in `event.proto`.
const EVENTS_FIELD: u32 = 100;

/// The events a stored message holds, in order.
pub fn decode(payload: &[u8]) -> Result<Vec<Event>, prost::DecodeError> {
    let batch = EventBatch::decode(payload)?;
    Ok(of(&batch, payload)?.into_owned())
}

/// The events of a stored message already decoded as `batch` (a consumer of `EventBatch`
/// messages): its events, or, when it holds none, the bare event the payload is.
pub fn of<'a>(batch: &'a EventBatch, payload: &[u8]) -> Result<Cow<'a, [Event]>, prost::DecodeError> {
    if !batch.events.is_empty() {
        return Ok(Cow::Borrowed(&batch.events));
    }
    // A bare event (written before batching) has none of the batch's fields; an empty payload
    // is no event at all.
    if payload.is_empty() {
        return Ok(Cow::Owned(Vec::new()));
    }
    Ok(Cow::Owned(vec![Event::decode(payload)?]))
}

/// `events` encoded as one `EventBatch`, without copying them into one first.
pub fn encode(events: &[Event]) -> Bytes {
    let len: usize = events.iter().map(|e| prost::encoding::message::encoded_len(EVENTS_FIELD, e)).sum();
    let mut buf = Vec::with_capacity(len);
    for event in events {
        prost::encoding::message::encode(EVENTS_FIELD, event, &mut buf);
    }
    Bytes::from(buf)
}

/// `events` as the messages that store them: runs of consecutive events, each encoded as one
/// batch under [`MAX_BATCH_BYTES`], with the index of its first event and how many it holds.
pub fn batches(events: &[Event]) -> Vec<(usize, usize, Bytes)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 0;
    for (i, event) in events.iter().enumerate() {
        let len = event.encoded_len();
        if i > start && size + len > MAX_BATCH_BYTES {
            out.push((start, i - start, encode(&events[start..i])));
            start = i;
            size = 0;
        }
        size += len + 4;
    }
    if start < events.len() {
        out.push((start, events.len() - start, encode(&events[start..])));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_proto::event::Kind;

    fn event(seq: u64, padding: usize) -> Event {
        Event {
            goal_id: "g-1".into(),
            seq,
            kind: Some(Kind::GoalAccepted(hermes_proto::GoalAccepted {
                text: "x".repeat(padding),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn a_batch_and_a_bare_event_both_decode() {
        let events: Vec<Event> = (1..=3).map(|s| event(s, 10)).collect();
        let stored = batches(&events);
        assert_eq!(stored.len(), 1);
        assert_eq!(decode(&stored[0].2).unwrap(), events);
        let bare = events[0].encode_to_vec();
        assert_eq!(decode(&bare).unwrap(), vec![events[0].clone()]);
        assert!(decode(&[]).unwrap().is_empty());
        assert!(decode(b"\xff\xff not protobuf").is_err());
        // The encoder writes what prost's own encoding of the message writes.
        assert_eq!(encode(&events), EventBatch { events: events.clone() }.encode_to_vec());
        let batch = EventBatch::decode(&stored[0].2[..]).unwrap();
        assert_eq!(of(&batch, &stored[0].2).unwrap().as_ref(), events.as_slice());
    }

    #[test]
    fn large_transitions_split_into_ordered_batches_under_the_limit() {
        let events: Vec<Event> = (1..=40).map(|s| event(s, 20_000)).collect();
        let stored = batches(&events);
        assert!(stored.len() > 1);
        let mut next = 0;
        let mut all = Vec::new();
        for (start, count, bytes) in &stored {
            assert_eq!(*start, next);
            next += count;
            assert!(bytes.len() <= MAX_BATCH_BYTES + 64, "{}", bytes.len());
            all.extend(decode(bytes).unwrap());
        }
        assert_eq!(all, events);
        // An event over the limit goes alone.
        let huge = vec![event(1, 10), event(2, MAX_BATCH_BYTES + 1), event(3, 10)];
        let counts: Vec<usize> = batches(&huge).iter().map(|b| b.1).collect();
        assert_eq!(counts, [1, 1, 1]);
    }
}
