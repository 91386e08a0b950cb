//! Sequence accounting per observation domain: what each exporter sent, lost and reordered,
//! without believing what cannot be loss.
//!
//! A domain holds up to [`MAX_STREAMS`] *sequence streams*, each with the number it expects
//! next. A message's number is matched against them:
//!
//! - equal to a stream's expected number: in order;
//! - ahead of a stream by at most `window` ([`super::DecodeConfig::seq_window`]): a gap, counted
//!   as lost once the stream has gone on in order for [`CONFIRM`] messages (or [`SETTLE_AFTER`]
//!   later, or when the decoder stops). A message that then arrives right where a jump of more
//!   than [`LATE_GAP`] started shows the "gap" was another exporter's numbering: nothing is
//!   counted; one inside a smaller gap is a late message and fills it;
//! - behind a stream by at most [`REORDER_WINDOW`]: out of order (a duplicate or a late
//!   message); the stream's expected number does not move back;
//! - anything else — a jump beyond the window either way — is not loss: it starts a new stream
//!   (an exporter restart, or another exporter in the same domain), counted as a reset.
//!
//! When messages keep matching two streams in turn, the domain carries **two sequence streams**
//! (two exporters share an observation domain, against RFC 7011 §3.1): counted once per domain
//! (`seq_concurrent_domains`), logged, and each stream is accounted on its own, so the jumps
//! between them are never counted as lost messages.
//!
//! Bounds: at most [`MAX_TRACKED_DOMAINS`] domains per decoder; a new domain past it evicts the
//! one idle longest (counted `seq_evicted_domains`; its figures leave the per-domain list, its
//! totals stay in the decoder's counters). At most [`MAX_STREAMS`] streams per domain; a new one
//! past it replaces the one idle longest.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use stel_store::log_limit::LogLimiter;

use super::{DecodeStats, DomainSeqStats};
use crate::ipfix::SeqMode;

/// Most observation domains one decoder keeps sequence state and figures for.
pub const MAX_TRACKED_DOMAINS: usize = 1024;
/// Most sequence streams one domain holds.
pub const MAX_STREAMS: usize = 4;
/// In-order messages after a gap before its loss is counted.
pub(super) const CONFIRM: u32 = 64;
/// Largest step backwards still taken as reordering (beyond: a new stream).
pub(super) const REORDER_WINDOW: u32 = 1024;
/// Largest gap a message arriving at its start fills as a late message; past it, such a
/// message is another exporter's numbering resuming (the gap was the jump between two streams).
pub(super) const LATE_GAP: u32 = 64;
/// A gap not yet confirmed by [`CONFIRM`] messages is counted this long after it was seen (at
/// the decoder's next flush).
pub(super) const SETTLE_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Pending {
    /// The number the stream expected before it jumped.
    from: u32,
    /// The jump.
    size: u32,
    /// In-order messages since.
    confirms: u32,
    /// When it was seen (a gap followed by silence is counted [`SETTLE_AFTER`] later).
    at: Instant,
}

#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    expected: Option<u32>,
    /// Clock of its last message.
    used: u64,
    pending: Option<Pending>,
}

#[derive(Debug, Clone)]
struct DomainSeq {
    domain: u32,
    streams: [Stream; MAX_STREAMS],
    n: usize,
    /// The stream of the last message.
    cur: usize,
    used: u64,
    concurrent: bool,
}

impl DomainSeq {
    fn new(domain: u32) -> Self {
        Self {
            domain,
            streams: [Stream::default(); MAX_STREAMS],
            n: 1,
            cur: 0,
            used: 0,
            concurrent: false,
        }
    }
}

/// Where a message was placed: the domain's index and its stream.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placed {
    /// Index in `DecodeStats::domains`.
    pub(super) domain: usize,
    /// `usize::MAX`: out of order (no stream moves).
    stream: usize,
}

/// Every domain's streams; figures go to [`DecodeStats`] (`domains` at the same index).
#[derive(Debug)]
pub(super) struct SeqTracker {
    mode: SeqMode,
    window: u32,
    domains: Vec<DomainSeq>,
    index: HashMap<u32, usize>,
    /// The domain of the last message (one exporter per decoder is the common case).
    last: usize,
    clock: u64,
    log: LogLimiter,
}

impl SeqTracker {
    pub(super) fn new(mode: SeqMode, window: u32) -> Self {
        Self {
            mode,
            window: window.clamp(1, 0x7fff_ffff),
            domains: Vec::new(),
            index: HashMap::new(),
            last: 0,
            clock: 0,
            log: LogLimiter::new(Duration::from_secs(60)),
        }
    }

    /// Forgets every expected number (the exporter restarted): the next message of each domain
    /// is in order.
    pub(super) fn reset(&mut self) {
        for d in &mut self.domains {
            d.streams = [Stream::default(); MAX_STREAMS];
            d.n = 1;
            d.cur = 0;
        }
    }

    fn domain_index(&mut self, domain: u32, st: &mut DecodeStats) -> usize {
        if let Some(&i) = self.index.get(&domain) {
            return i;
        }
        let fresh = DomainSeqStats {
            domain,
            ..Default::default()
        };
        if self.domains.len() < MAX_TRACKED_DOMAINS {
            self.domains.push(DomainSeq::new(domain));
            st.domains.push(fresh);
            self.index.insert(domain, self.domains.len() - 1);
            return self.domains.len() - 1;
        }
        // Full: the domain idle longest makes room (its pending gaps are settled first).
        let i = self
            .domains
            .iter()
            .enumerate()
            .min_by_key(|(_, d)| d.used)
            .map_or(0, |(i, _)| i);
        self.settle_domain(i, st);
        self.index.remove(&self.domains[i].domain);
        self.domains[i] = DomainSeq::new(domain);
        st.domains[i] = fresh;
        self.index.insert(domain, i);
        st.seq_evicted_domains += 1;
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(
                domain,
                max = MAX_TRACKED_DOMAINS,
                suppressed,
                "More observation domains than a decoder tracks; the one idle longest lost its sequence state."
            );
        }
        i
    }

    /// Places message `seq` of `domain`: counts reordering, resets and (once confirmed) gaps;
    /// [`Self::advance`] then moves the stream past it.
    pub(super) fn place(&mut self, domain: u32, seq: u32, st: &mut DecodeStats) -> Placed {
        self.clock += 1;
        let clock = self.clock;
        let i = match self.domains.get(self.last) {
            Some(d) if d.domain == domain => self.last,
            _ => self.domain_index(domain, st),
        };
        self.last = i;
        let window = self.window;
        let d = &mut self.domains[i];
        d.used = clock;
        // In order on the current stream (the hot path), or on another one.
        let cur = d.cur;
        let hit = if d.streams[cur].expected == Some(seq) {
            Some(cur)
        } else {
            (0..d.n).find(|&k| d.streams[k].expected == Some(seq))
        };
        if let Some(k) = hit {
            return self.in_order(i, k, clock, st);
        }
        if let Some(k) = (0..d.n).find(|&k| d.streams[k].expected.is_none()) {
            d.streams[k].used = clock;
            d.cur = k;
            return Placed {
                domain: i,
                stream: k,
            };
        }
        // Another exporter resuming where a stream jumped from: that jump was not loss. (A jump
        // of at most LATE_GAP is taken as reordering instead: the message fills its gap below.)
        if let Some(j) = (0..d.n).find(|&j| {
            d.streams[j]
                .pending
                .is_some_and(|p| p.from == seq && p.size > LATE_GAP)
        }) {
            d.streams[j].pending = None;
            let k = Self::new_stream(d, clock);
            d.streams[k].expected = Some(seq);
            self.mark_concurrent(i, st);
            return Placed {
                domain: i,
                stream: k,
            };
        }
        let expected = |k: usize| d.streams[k].expected.unwrap_or(seq);
        let ahead = (0..d.n)
            .map(|k| (seq.wrapping_sub(expected(k)), k))
            .filter(|&(g, _)| g <= window)
            .min();
        let behind = (0..d.n)
            .map(|k| (expected(k).wrapping_sub(seq), k))
            .filter(|&(b, _)| b <= REORDER_WINDOW)
            .min();
        if let Some((gap, k)) = ahead {
            // A gap: the previous one on this stream (if still pending) is loss now.
            if let Some(p) = d.streams[k].pending.take() {
                commit(p, self.mode, i, st);
            }
            let from = d.streams[k].expected.unwrap_or(seq);
            d.streams[k].pending = Some(Pending {
                from,
                size: gap,
                confirms: 0,
                at: Instant::now(),
            });
            d.streams[k].used = clock;
            d.cur = k;
            let ds = &mut st.domains[i];
            ds.largest_gap = ds.largest_gap.max(u64::from(gap));
            return Placed {
                domain: i,
                stream: k,
            };
        }
        if let Some((_, k)) = behind {
            st.seq_out_of_order += 1;
            st.domains[i].out_of_order += 1;
            d.streams[k].used = clock;
            // A late message inside a gap not counted yet: one fewer lost.
            if let Some(p) = d.streams[k].pending.as_mut() {
                if seq.wrapping_sub(p.from) < p.size {
                    p.size -= 1;
                    if p.size == 0 {
                        d.streams[k].pending = None;
                    }
                }
            }
            // The stream's expected number stays: a late message does not rewind it.
            return Placed {
                domain: i,
                stream: usize::MAX,
            };
        }
        // Far from every stream: a restart, or another exporter. Not loss.
        let k = Self::new_stream(d, clock);
        d.streams[k].expected = Some(seq);
        st.seq_resets += 1;
        st.domains[i].resets += 1;
        Placed {
            domain: i,
            stream: k,
        }
    }

    fn in_order(&mut self, i: usize, k: usize, clock: u64, st: &mut DecodeStats) -> Placed {
        let d = &mut self.domains[i];
        if k != d.cur && d.streams[d.cur].used > d.streams[k].used && d.n > 1 {
            // Back to a stream after another one had messages: interleaved streams.
            self.mark_concurrent(i, st);
        }
        let d = &mut self.domains[i];
        d.streams[k].used = clock;
        d.cur = k;
        if let Some(p) = d.streams[k].pending.as_mut() {
            p.confirms += 1;
            if p.confirms >= CONFIRM {
                let p = d.streams[k].pending.take().expect("just seen");
                commit(p, self.mode, i, st);
            }
        }
        Placed {
            domain: i,
            stream: k,
        }
    }

    fn mark_concurrent(&mut self, i: usize, st: &mut DecodeStats) {
        let d = &mut self.domains[i];
        st.domains[i].max_streams = st.domains[i].max_streams.max(d.n as u64);
        if d.concurrent {
            return;
        }
        d.concurrent = true;
        st.seq_concurrent_domains += 1;
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(
                domain = d.domain,
                streams = d.n,
                suppressed,
                "Two sequence streams in one observation domain (two exporters share the domain?); each is accounted on its own, the jumps between them are not loss."
            );
        }
    }

    /// A stream slot for a new stream: a free one, else the one idle longest.
    fn new_stream(d: &mut DomainSeq, clock: u64) -> usize {
        let k = if d.n < MAX_STREAMS {
            d.n += 1;
            d.n - 1
        } else {
            (0..MAX_STREAMS)
                .min_by_key(|&k| d.streams[k].used)
                .unwrap_or(0)
        };
        d.streams[k] = Stream {
            expected: None,
            used: clock,
            pending: None,
        };
        d.cur = k;
        k
    }

    /// Moves the stream past message `seq` (`records` data records in it; `None`: unknown, the
    /// next message restarts the numbering in RFC 7011 mode).
    pub(super) fn advance(&mut self, at: Placed, seq: u32, records: Option<u32>) {
        if at.stream == usize::MAX {
            return; // out of order: the stream keeps its expected number
        }
        let d = &mut self.domains[at.domain];
        d.streams[at.stream].expected = match (self.mode, records) {
            (SeqMode::PerMessage, _) => Some(seq.wrapping_add(1)),
            (SeqMode::Rfc7011, Some(r)) => Some(seq.wrapping_add(r)),
            (SeqMode::Rfc7011, None) => None,
        };
    }

    /// Counts pending gaps seen at least `min_age` ago as lost (the stream went quiet after
    /// them: nothing showed they were another exporter's numbering); `None`: all of them.
    pub(super) fn settle(&mut self, st: &mut DecodeStats, min_age: Option<Duration>) {
        let now = Instant::now();
        let mode = self.mode;
        for (i, d) in self.domains.iter_mut().enumerate() {
            for k in 0..d.n {
                let due = d.streams[k]
                    .pending
                    .is_some_and(|p| min_age.is_none_or(|a| now.duration_since(p.at) >= a));
                if due {
                    let p = d.streams[k].pending.take().expect("checked");
                    commit(p, mode, i, st);
                }
            }
        }
    }

    fn settle_domain(&mut self, i: usize, st: &mut DecodeStats) {
        let mode = self.mode;
        let d = &mut self.domains[i];
        for k in 0..d.n {
            if let Some(p) = d.streams[k].pending.take() {
                commit(p, mode, i, st);
            }
        }
    }
}

/// Counts a confirmed gap as lost (messages or records, by numbering mode).
fn commit(p: Pending, mode: SeqMode, i: usize, st: &mut DecodeStats) {
    let gap = u64::from(p.size);
    let ds = &mut st.domains[i];
    match mode {
        SeqMode::PerMessage => {
            ds.lost_messages += gap;
            st.seq_lost_messages += gap;
        }
        SeqMode::Rfc7011 => {
            ds.lost_records += gap;
            st.seq_lost_records += gap;
        }
    }
    st.domains[i].gap_events += 1;
    st.seq_gap_events += 1;
}
