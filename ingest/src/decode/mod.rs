//! IPFIX decode: bytes in, counter batches out. No I/O, no locks, no allocation per message or
//! per record — so the daemon's per-core workers, the benchmarks and the fuzzer all call the same
//! code.
//!
//! A [`Decoder`] is owned by one thread. It keeps
//! - the template cache, scoped by (observation domain, template ID), each entry compiled once into
//!   a [`DecodePlan`];
//! - the sessions (one per HFT profile/group; a session may span several templates when the
//!   switch splits a large group), each with its own [`BatchBuilder`];
//! - sequence-number state per observation domain, and every counter in [`DecodeStats`].
//!
//! Decoded batches are pushed into a [`BatchSink`] when a builder fills up, when a session's
//! templates change (no batch mixes schemas) and on [`Decoder::flush`].

mod bswap;
mod seq;
mod stats;

use std::{collections::HashMap, sync::Arc};

pub use bswap::{portable as portable_bswap, select as select_bswap, BswapFn};
pub use seq::{MAX_STREAMS, MAX_TRACKED_DOMAINS};
pub use stats::{DecodeStats, DomainSeqStats, Malformed};
pub use stel_store::CounterBatch;
use stel_store::{batch::MAX_PARTS, BatchBuilder, CounterColumn, SessionSchema};

use crate::ipfix::{
    be16, be32, ConfigError, DecodePlan, SeqMode, TemplateError, TemplateMessages, TemplateRecord,
    MESSAGE_HEADER_LEN, MIN_DATA_SET_ID, OPTIONS_TEMPLATE_SET_ID, SET_HEADER_LEN, TEMPLATE_SET_ID,
    VERSION,
};

/// Profile of sessions known only from in-band templates (no STATE_DB / session file): the
/// tables are `anonymous-d<domain>-t<template>` / `<object type>`.
pub const ANONYMOUS_PROFILE: &str = "anonymous";

/// Receives finished batches. The decoder calls it on its own thread.
pub trait BatchSink {
    fn on_batch(&mut self, batch: CounterBatch);
}

impl<F: FnMut(CounterBatch)> BatchSink for F {
    fn on_batch(&mut self, batch: CounterBatch) {
        self(batch)
    }
}

/// Decoder settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecodeConfig {
    /// How the exporter counts sequence numbers (default: per message, as the HFT HLD says).
    pub seq_mode: SeqMode,
    /// Upper bound of one batch's counter buffer, bytes. Rows per batch =
    /// `batch_bytes / (8 × counters per snapshot)`, at least 1, at most `max_batch_rows`.
    pub batch_bytes: usize,
    /// Most snapshots per batch.
    pub max_batch_rows: usize,
    /// Largest sequence-number jump still counted as loss (messages, or records with
    /// `rfc7011`); a larger jump either way starts a new sequence stream (an exporter restart,
    /// or another exporter in the domain) and is counted as a reset. Default 2^20: 40 s of
    /// messages at the design rate.
    pub seq_window: u32,
    /// Most in-band templates (announced in the stream rather than registered by a session,
    /// options templates included) one decoder holds; past it, the one whose data came longest
    /// ago is evicted (counted, logged).
    pub max_templates: usize,
    /// Most in-band templates of one observation domain (same rule).
    pub max_templates_per_domain: usize,
    /// Most bytes of batch buffers one decoder holds (one per session with data); past it, the
    /// session whose data came longest ago flushes and gives its buffer back.
    pub max_batch_memory_bytes: usize,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        Self {
            seq_mode: SeqMode::PerMessage,
            batch_bytes: 8 << 20,
            max_batch_rows: 8192,
            seq_window: 1 << 20,
            max_templates: 1024,
            max_templates_per_domain: 256,
            max_batch_memory_bytes: 256 << 20,
        }
    }
}

impl DecodeConfig {
    /// Small batches, for tests.
    pub fn for_test() -> Self {
        Self {
            batch_bytes: 64 << 10,
            max_batch_rows: 64,
            ..Self::default()
        }
    }
}

pub use stel_store::hft::SessionSpec;

/// Why a session could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("object_names has {names} entries but object_ids has {ids}")]
    LabelCountMismatch { names: usize, ids: usize },
    #[error("duplicate object id {0}")]
    DuplicateLabel(u16),
    #[error("session_config holds no template")]
    NoTemplates,
    #[error("session_config is not a sequence of IPFIX messages: {0}")]
    BadConfig(ConfigError),
    #[error("session_config template: {0}")]
    Template(#[from] TemplateError),
    #[error("a snapshot may be split over at most {MAX_PARTS} templates, got {0}")]
    TooManyParts(usize),
    #[error("session_config defines template {0} twice")]
    DuplicateTemplate(u16),
}

#[derive(Debug, Clone)]
enum SlotKind {
    /// A counter template, compiled.
    Counters(Arc<DecodePlan>),
    /// An options template: its data is recognised, counted and skipped.
    Options { record_len: usize },
    /// A registered session's part whose template was withdrawn: data for it is unknown until
    /// the template comes back.
    Withdrawn,
}

/// A template's key: (observation domain, template ID).
type SlotKey = (u32, u16);

#[derive(Debug)]
struct Slot {
    kind: SlotKind,
    session: usize,
    part: usize,
    /// Decoder clock of its last data set (or of its announcement): the eviction order of
    /// in-band templates.
    used: u64,
}

impl Slot {
    /// Announced in the stream (an anonymous session's template or an options template), as
    /// opposed to a registered session's part: what the template bounds count and evict.
    fn in_band(&self, sessions: &[Session]) -> bool {
        match self.kind {
            SlotKind::Options { .. } => true,
            _ => sessions.get(self.session).is_some_and(|s| s.spec.is_none()),
        }
    }
}

#[derive(Debug)]
struct Session {
    spec: Option<SessionSpec>,
    /// Label → SAI object type as the registered templates define them: a spec name is used
    /// for a column only when the column's label still has that object type (an inline
    /// template that redefines a label must not inherit another object's name).
    label_types: HashMap<u16, u32>,
    /// (template id, plan) per part; `None` until the part's template is known.
    parts: Vec<(u16, Option<Arc<DecodePlan>>)>,
    builder: Option<BatchBuilder>,
    /// Bytes the builder's buffers hold (counted against `max_batch_memory_bytes`).
    builder_bytes: usize,
    /// Decoder clock of its last data.
    used: u64,
    generation: u64,
    live: bool,
}

/// The per-thread IPFIX decoder. See the module docs.
#[derive(Debug)]
pub struct Decoder {
    config: DecodeConfig,
    bswap: BswapFn,
    slots: HashMap<(u32, u16), Slot>,
    sessions: Vec<Session>,
    seq: seq::SeqTracker,
    stats: DecodeStats,
    generation: u64,
    /// Bytes of all builders' buffers.
    builder_bytes: usize,
    /// Advances per data set and template: the eviction order.
    clock: u64,
    log_evict: stel_store::log_limit::LogLimiter,
    log_buffers: stel_store::log_limit::LogLimiter,
}

impl Decoder {
    pub fn new(config: DecodeConfig) -> Self {
        let (bswap, _) = bswap::select();
        Self {
            seq: seq::SeqTracker::new(config.seq_mode, config.seq_window),
            config,
            bswap,
            slots: HashMap::new(),
            sessions: Vec::new(),
            stats: DecodeStats::default(),
            generation: 0,
            builder_bytes: 0,
            clock: 0,
            log_evict: stel_store::log_limit::LogLimiter::new(std::time::Duration::from_secs(60)),
            log_buffers: stel_store::log_limit::LogLimiter::new(std::time::Duration::from_secs(60)),
        }
    }

    /// Uses `f` for the contiguous counter copy (benchmarks compare implementations).
    pub fn with_bswap(mut self, f: BswapFn) -> Self {
        self.bswap = f;
        self
    }

    pub fn stats(&self) -> &DecodeStats {
        &self.stats
    }

    /// Registers a session from the control plane: `templates` holds one or more IPFIX messages
    /// with template sets (STATE_DB `session_config`); every template in them becomes a part of
    /// the session's snapshot, in order. Replaces an earlier registration of the same templates.
    ///
    /// # Errors
    /// See [`SessionError`]; nothing is registered on error.
    pub fn register_session<S: BatchSink>(
        &mut self,
        spec: SessionSpec,
        templates: &[u8],
        sink: &mut S,
    ) -> Result<usize, SessionError> {
        let plans = compile_session(&spec, templates)?;
        for (tid, _) in &plans {
            self.withdraw(spec.domain, *tid, sink);
        }
        let domain = spec.domain;
        let idx = self.new_session(Some(spec), plans);
        for part in 0..self.sessions[idx].parts.len() {
            let (tid, plan) = self.sessions[idx].parts[part].clone();
            let kind = plan.map_or(SlotKind::Withdrawn, SlotKind::Counters);
            self.slots.insert(
                (domain, tid),
                Slot {
                    kind,
                    session: idx,
                    part,
                    used: self.clock,
                },
            );
        }
        self.stats.sessions_registered += 1;
        Ok(idx)
    }

    /// Unregisters the session that owns `(domain, template_id)`: flushes its batch, forgets all
    /// its templates.
    pub fn unregister_session<S: BatchSink>(
        &mut self,
        domain: u32,
        template_id: u16,
        sink: &mut S,
    ) {
        let owner = self
            .slots
            .get(&(domain, template_id))
            .filter(|sl| !matches!(sl.kind, SlotKind::Options { .. }));
        if let Some(s) = owner.map(|sl| sl.session) {
            self.close_session(s, sink);
            self.slots.retain(|_, slot| slot.session != s);
        }
    }

    /// Counts every sequence gap still waiting for confirmation as lost (the decoder stops, or a
    /// test reads the figures now).
    pub fn settle_sequences(&mut self) {
        self.seq.settle(&mut self.stats, None);
    }

    /// Forgets the expected sequence numbers of every domain: the exporter restarted (genl
    /// family re-registered), so its numbering starts over and the next message is not a gap.
    pub fn reset_sequences(&mut self) {
        self.seq.reset();
    }

    /// A message of `domain` with sequence number `seq` was dropped by the user-space template
    /// filter before decode: it takes its place in the sequence (a gap before it is still loss)
    /// and is counted as filtered, never as lost. With RFC 7011 numbering its record count is
    /// unknown (its template is not registered), so the next message restarts the numbering.
    pub fn skip_filtered(&mut self, domain: u32, seq: u32) {
        self.stats.filtered_messages += 1;
        let at = self.seq.place(domain, seq, &mut self.stats);
        self.stats.domains[at.domain].filtered_messages += 1;
        self.seq.advance(at, seq, None);
    }

    /// Unregisters the session named `profile`/`group` (what STATE_DB knows it by). Returns
    /// whether such a session was registered.
    pub fn unregister_named<S: BatchSink>(
        &mut self,
        profile: &str,
        group: &str,
        sink: &mut S,
    ) -> bool {
        let found = self.sessions.iter().position(|s| {
            s.live
                && s.spec
                    .as_ref()
                    .is_some_and(|sp| sp.profile == profile && sp.group == group)
        });
        if let Some(s) = found {
            self.close_session(s, sink);
            self.slots.retain(|_, slot| slot.session != s);
        }
        found.is_some()
    }

    fn new_session(
        &mut self,
        spec: Option<SessionSpec>,
        parts: Vec<(u16, Option<Arc<DecodePlan>>)>,
    ) -> usize {
        let label_types = parts
            .iter()
            .filter_map(|(_, p)| p.as_ref())
            .flat_map(|p| p.keys.iter().map(|(l, k)| (*l, k.object_type)))
            .collect();
        let session = Session {
            spec,
            label_types,
            parts,
            builder: None,
            builder_bytes: 0,
            used: self.clock,
            generation: 0,
            live: true,
        };
        // Reuse a closed session's index so the vector does not grow with churn.
        if let Some(i) = self.sessions.iter().position(|s| !s.live) {
            self.sessions[i] = session;
            i
        } else {
            self.sessions.push(session);
            self.sessions.len() - 1
        }
    }

    fn close_session<S: BatchSink>(&mut self, s: usize, sink: &mut S) {
        self.flush_session(s, sink);
        self.sessions[s].live = false;
        self.drop_builder(s);
    }

    /// Frees session `s`'s batch buffers (flushed before by the caller).
    fn drop_builder(&mut self, s: usize) {
        let sess = &mut self.sessions[s];
        sess.builder = None;
        self.builder_bytes -= std::mem::take(&mut sess.builder_bytes);
    }

    fn flush_session<S: BatchSink>(&mut self, s: usize, sink: &mut S) {
        if let Some(b) = self.sessions[s].builder.as_mut() {
            if !b.is_empty() {
                let mut batch = b.finish();
                if batch.values.len() * 4 < batch.values.capacity() {
                    // A partial flush (a slow session, the flush interval, a schema change): the
                    // batch leaves with buffers of its size, and the builder keeps the big ones
                    // (as its spare), so queued batches hold their data, not a full batch's
                    // buffers each. Full batches (the design-rate path) never copy.
                    let small = CounterBatch {
                        schema: Arc::clone(&batch.schema),
                        ts: batch.ts.clone(),
                        values: batch.values.clone(),
                        part_masks: batch.part_masks.clone(),
                    };
                    b.recycle(std::mem::replace(&mut batch, small));
                }
                self.stats.batches += 1;
                self.stats.missing_samples += batch.missing_samples() as u64;
                sink.on_batch(batch);
            }
        }
    }

    /// Finishes every non-empty batch and hands it to `sink`; sequence gaps seen more than
    /// [`seq::SETTLE_AFTER`] ago and not confirmed yet are counted as lost.
    pub fn flush<S: BatchSink>(&mut self, sink: &mut S) {
        self.seq.settle(&mut self.stats, Some(seq::SETTLE_AFTER));
        for s in 0..self.sessions.len() {
            if self.sessions[s].live {
                self.flush_session(s, sink);
            }
        }
    }

    /// Returns a batch's buffers to the session that produced it (if it still exists with the
    /// same schema), so steady-state decoding does not allocate.
    pub fn recycle(&mut self, batch: CounterBatch) {
        for s in &mut self.sessions {
            if let Some(b) = s.builder.as_mut() {
                if Arc::ptr_eq(b.schema(), &batch.schema) {
                    b.recycle(batch);
                    return;
                }
            }
        }
    }

    fn withdraw<S: BatchSink>(&mut self, domain: u32, tid: u16, sink: &mut S) {
        let Some(slot) = self.slots.remove(&(domain, tid)) else {
            return;
        };
        let s = slot.session;
        match slot.kind {
            SlotKind::Withdrawn => {
                self.slots.insert((domain, tid), slot);
                return;
            }
            SlotKind::Options { .. } => {}
            SlotKind::Counters(_) if self.sessions[s].spec.is_none() => self.close_session(s, sink),
            SlotKind::Counters(_) => {
                // A registered session keeps its shape; the part waits for its template again.
                self.flush_session(s, sink);
                self.sessions[s].parts[slot.part].1 = None;
                self.drop_builder(s);
                self.slots.insert(
                    (domain, tid),
                    Slot {
                        kind: SlotKind::Withdrawn,
                        ..slot
                    },
                );
            }
        }
        self.stats.templates_withdrawn += 1;
    }

    fn schema_for(&mut self, s: usize, domain: u32) -> Arc<SessionSchema> {
        self.generation += 1;
        let sess = &mut self.sessions[s];
        sess.generation = self.generation;
        let names: HashMap<u16, &str> = sess
            .spec
            .as_ref()
            .map(|sp| {
                sp.object_ids
                    .iter()
                    .copied()
                    .zip(sp.object_names.iter().map(String::as_str))
                    .collect()
            })
            .unwrap_or_default();
        let mut columns = Vec::new();
        let mut part_offsets = Vec::new();
        for (_, plan) in &sess.parts {
            part_offsets.push(columns.len());
            if let Some(p) = plan {
                for (label, key) in &p.keys {
                    let known = sess.label_types.get(label) == Some(&key.object_type);
                    columns.push(CounterColumn {
                        label: *label,
                        object: names
                            .get(label)
                            .filter(|_| known)
                            .map_or_else(|| format!("unknown_{label}"), |n| n.to_string()),
                        key: *key,
                    });
                }
            }
        }
        let (profile, group) = match &sess.spec {
            Some(sp) => (sp.profile.clone(), sp.group.clone()),
            None => {
                let group = sess
                    .parts
                    .first()
                    .and_then(|(_, p)| p.as_ref())
                    .and_then(|p| p.keys.first())
                    .map(|(_, k)| k.object_type_name())
                    .unwrap_or_default();
                // One table per (domain, template): unrelated exporters' templates never share
                // a directory (nor a schema).
                let tid = sess.parts.first().map_or(0, |(t, _)| *t);
                (format!("{ANONYMOUS_PROFILE}-d{domain}-t{tid}"), group)
            }
        };
        Arc::new(SessionSchema {
            profile,
            group,
            domain,
            template_ids: sess.parts.iter().map(|(t, _)| *t).collect(),
            part_offsets,
            columns,
            generation: sess.generation,
        })
    }

    fn rows_per_batch(&self, width: usize) -> usize {
        (self.config.batch_bytes / (8 * width.max(1))).clamp(1, self.config.max_batch_rows.max(1))
    }

    /// Registers or replaces one in-band template. Data already decoded under the old template is
    /// flushed first, so no batch mixes schemas.
    fn apply_template<S: BatchSink>(
        &mut self,
        domain: u32,
        rec: TemplateRecord,
        options: bool,
        sink: &mut S,
    ) {
        // Announcement order breaks ties in the eviction order.
        self.clock += 1;
        let tid = rec.template_id;
        if rec.fields.is_empty() {
            if tid == TEMPLATE_SET_ID || tid == OPTIONS_TEMPLATE_SET_ID {
                // Withdraw all (options) templates of the domain.
                let tids: Vec<u16> = self
                    .slots
                    .keys()
                    .filter(|(d, _)| *d == domain)
                    .map(|(_, t)| *t)
                    .collect();
                for t in tids {
                    self.withdraw(domain, t, sink);
                }
            } else {
                self.withdraw(domain, tid, sink);
            }
            return;
        }
        if tid < MIN_DATA_SET_ID {
            self.stats.count(Malformed::TemplateBadId);
            return;
        }
        if options {
            // Options templates (e.g. exporter statistics) are parsed, validated and remembered so
            // their data sets are recognised and skipped, and counted.
            let Some(len) = rec.record_len() else {
                self.stats.count(Malformed::TemplateFieldLength);
                return;
            };
            self.withdraw(domain, tid, sink);
            if self.slots.contains_key(&(domain, tid)) {
                // A registered session's ID reused for options data: keep the session's slot.
                self.stats.count(Malformed::TemplateBadId);
                return;
            }
            let kind = SlotKind::Options {
                record_len: len.max(1),
            };
            self.make_room(domain, sink);
            self.slots.insert(
                (domain, tid),
                Slot {
                    kind,
                    session: usize::MAX,
                    part: 0,
                    used: self.clock,
                },
            );
            self.stats.options_templates += 1;
            return;
        }
        let plan = match rec.compile() {
            Ok(p) => Arc::new(p),
            Err(e) => {
                self.stats.count(Malformed::from_template_error(&e));
                return;
            }
        };
        let existing = self
            .slots
            .get(&(domain, tid))
            .map(|sl| (sl.kind.clone(), sl.session, sl.part));
        match existing {
            Some((SlotKind::Counters(old), _, _)) if *old == *plan => {
                self.stats.templates_refreshed += 1; // the periodic resend of the same template
            }
            Some((SlotKind::Counters(_) | SlotKind::Withdrawn, s, part))
                if self.sessions[s].spec.is_some() =>
            {
                // A registered session's part: replace it in place (a new schema generation).
                // Names follow labels only where the label keeps its object type (schema_for).
                let sess = &self.sessions[s];
                let relabelled = plan
                    .keys
                    .iter()
                    .filter(|(l, k)| sess.label_types.get(l) != Some(&k.object_type))
                    .count();
                if relabelled > 0 {
                    self.stats.templates_overriding_session += 1;
                    let sp = sess.spec.as_ref().expect("guarded");
                    tracing::warn!(
                        profile = %sp.profile,
                        group = %sp.group,
                        domain,
                        template = tid,
                        relabelled,
                        "An inline template redefines a registered session's template; columns \
                         whose label changed object type are named unknown_<label>."
                    );
                }
                self.flush_session(s, sink);
                self.sessions[s].parts[part].1 = Some(Arc::clone(&plan));
                self.drop_builder(s);
                self.slots.insert(
                    (domain, tid),
                    Slot {
                        kind: SlotKind::Counters(plan),
                        session: s,
                        part,
                        used: self.clock,
                    },
                );
                self.stats.templates_replaced += 1;
            }
            Some((SlotKind::Counters(_), s, _)) => {
                self.close_session(s, sink);
                self.slots.remove(&(domain, tid));
                self.add_anonymous(domain, tid, plan);
                self.stats.templates_replaced += 1;
            }
            Some(_) | None => {
                self.slots.remove(&(domain, tid));
                self.make_room(domain, sink);
                self.add_anonymous(domain, tid, plan);
                self.stats.templates_registered += 1;
            }
        }
    }

    fn add_anonymous(&mut self, domain: u32, tid: u16, plan: Arc<DecodePlan>) {
        let s = self.new_session(None, vec![(tid, Some(Arc::clone(&plan)))]);
        self.slots.insert(
            (domain, tid),
            Slot {
                kind: SlotKind::Counters(plan),
                session: s,
                part: 0,
                used: self.clock,
            },
        );
    }

    /// Before a new in-band template of `domain` goes in: evicts the in-band template whose
    /// data came longest ago while the domain holds `max_templates_per_domain` of them or the
    /// decoder `max_templates` (registered sessions' templates are never evicted and do not
    /// count). Scans the slots: templates arrive rarely, data never pays for this.
    fn make_room<S: BatchSink>(&mut self, domain: u32, sink: &mut S) {
        loop {
            let (mut in_domain, mut total) = (0usize, 0usize);
            // (last use, slot key) of the oldest in-band template: in the domain, and anywhere.
            let mut lru_domain: Option<(u64, SlotKey)> = None;
            let mut lru_all: Option<(u64, SlotKey)> = None;
            for (&k, sl) in &self.slots {
                if !sl.in_band(&self.sessions) {
                    continue;
                }
                total += 1;
                let older = |cur: Option<(u64, SlotKey)>| cur.is_none_or(|(u, _)| sl.used < u);
                if older(lru_all) {
                    lru_all = Some((sl.used, k));
                }
                if k.0 == domain {
                    in_domain += 1;
                    if older(lru_domain) {
                        lru_domain = Some((sl.used, k));
                    }
                }
            }
            let (victim, reason) = if in_domain >= self.config.max_templates_per_domain.max(1) {
                (lru_domain, "max_templates_per_domain")
            } else if total >= self.config.max_templates.max(1) {
                (lru_all, "max_templates")
            } else {
                return;
            };
            let Some((_, (d, t))) = victim else { return };
            self.evict_template(d, t, sink);
            if let Some(suppressed) = self.log_evict.allow() {
                tracing::warn!(
                    domain = d,
                    template = t,
                    limit = reason,
                    suppressed,
                    "In-band template evicted to make room for a new one (its data is unknown until it is announced again)."
                );
            }
        }
    }

    /// Drops an in-band template: its anonymous session flushes and closes.
    fn evict_template<S: BatchSink>(&mut self, domain: u32, tid: u16, sink: &mut S) {
        if let Some(slot) = self.slots.remove(&(domain, tid)) {
            if let SlotKind::Counters(_) = slot.kind {
                self.close_session(slot.session, sink);
            }
            self.stats.templates_evicted += 1;
        }
    }

    /// Before session `s` allocates a builder of `bytes`: frees other sessions' buffers (the
    /// one whose data came longest ago first) while the total would pass
    /// `max_batch_memory_bytes`.
    fn make_builder_room<S: BatchSink>(&mut self, s: usize, bytes: usize, sink: &mut S) {
        while self.builder_bytes + bytes > self.config.max_batch_memory_bytes {
            let victim = self
                .sessions
                .iter()
                .enumerate()
                .filter(|(i, x)| *i != s && x.builder.is_some())
                .min_by_key(|(_, x)| x.used)
                .map(|(i, _)| i);
            let Some(v) = victim else { return };
            self.flush_session(v, sink);
            self.drop_builder(v);
            self.stats.batch_buffers_evicted += 1;
            if let Some(suppressed) = self.log_buffers.allow() {
                tracing::warn!(
                    budget = self.config.max_batch_memory_bytes,
                    suppressed,
                    "Batch buffers of the session idle longest freed to stay within max_batch_memory_bytes."
                );
            }
        }
    }

    /// Decodes a buffer of concatenated IPFIX messages (a netlink payload, a file chunk). Returns
    /// the number of complete messages decoded. A message whose header cannot be trusted ends the
    /// buffer (its length is meaningless, so there is no next message to find); everything else
    /// skips just the damaged set or message. Every case is counted in [`DecodeStats`].
    pub fn decode<S: BatchSink>(&mut self, buf: &[u8], sink: &mut S) -> usize {
        let mut off = 0;
        let mut n = 0;
        while off < buf.len() {
            let rest = &buf[off..];
            if rest.len() < MESSAGE_HEADER_LEN {
                self.stats.count(Malformed::MessageHeaderTruncated);
                self.stats.discarded_bytes += rest.len() as u64;
                break;
            }
            if be16(rest, 0) != VERSION {
                self.stats.count(Malformed::BadVersion);
                self.stats.discarded_bytes += rest.len() as u64;
                break;
            }
            let len = be16(rest, 2) as usize;
            if len < MESSAGE_HEADER_LEN {
                // SONiC's collector loops forever here on length 0; we stop.
                self.stats.count(Malformed::MessageLengthTooSmall);
                self.stats.discarded_bytes += rest.len() as u64;
                break;
            }
            if len > rest.len() {
                self.stats.count(Malformed::MessagePastBuffer);
                self.stats.discarded_bytes += rest.len() as u64;
                break;
            }
            self.decode_message(&rest[..len], sink);
            n += 1;
            off += len;
        }
        n
    }

    fn decode_message<S: BatchSink>(&mut self, msg: &[u8], sink: &mut S) {
        let seq = be32(msg, 8);
        let domain = be32(msg, 12);
        self.stats.messages += 1;
        self.stats.bytes += msg.len() as u64;
        let at = self.seq.place(domain, seq, &mut self.stats);
        let mut records = 0u32;
        let mut p = MESSAGE_HEADER_LEN;
        while p < msg.len() {
            let rest = &msg[p..];
            if rest.len() < SET_HEADER_LEN {
                self.stats.count(Malformed::SetHeaderTruncated);
                self.stats.discarded_bytes += rest.len() as u64;
                break;
            }
            let set_id = be16(rest, 0);
            let set_len = be16(rest, 2) as usize;
            if set_len < SET_HEADER_LEN {
                self.stats.count(Malformed::SetLengthTooSmall);
                self.stats.discarded_bytes += rest.len() as u64;
                break;
            }
            if set_len > rest.len() {
                self.stats.count(Malformed::SetPastMessage);
                self.stats.discarded_bytes += rest.len() as u64;
                break;
            }
            let body = &rest[SET_HEADER_LEN..set_len];
            match set_id {
                TEMPLATE_SET_ID | OPTIONS_TEMPLATE_SET_ID => {
                    self.template_set(domain, body, set_id == OPTIONS_TEMPLATE_SET_ID, sink)
                }
                id if id >= MIN_DATA_SET_ID => {
                    records += self.data_set(domain, id, body, sink);
                }
                _ => {
                    self.stats.count(Malformed::ReservedSetId);
                    self.stats.discarded_bytes += set_len as u64;
                }
            }
            p += set_len;
        }
        self.stats.domains[at.domain].messages += 1;
        self.seq.advance(at, seq, Some(records));
    }

    fn template_set<S: BatchSink>(
        &mut self,
        domain: u32,
        mut body: &[u8],
        options: bool,
        sink: &mut S,
    ) {
        if options {
            self.stats.options_template_sets += 1;
        } else {
            self.stats.template_sets += 1;
        }
        // A record needs at least 4 bytes; fewer left over is padding (RFC 7011 §3.3.1).
        while body.len() >= 4 {
            match TemplateRecord::parse(body, options) {
                Ok((rec, used)) => {
                    body = &body[used..];
                    self.apply_template(domain, rec, options, sink);
                }
                Err(e) => {
                    self.stats.count(Malformed::from_template_error(&e));
                    self.stats.discarded_bytes += body.len() as u64;
                    return;
                }
            }
        }
    }

    /// Decodes one data set; returns its record count (for RFC 7011 sequence accounting).
    fn data_set<S: BatchSink>(&mut self, domain: u32, id: u16, body: &[u8], sink: &mut S) -> u32 {
        self.clock += 1;
        let Some(slot) = self.slots.get_mut(&(domain, id)) else {
            self.stats.count(Malformed::UnknownTemplate);
            self.stats.unknown_template_bytes += body.len() as u64;
            return 0;
        };
        let plan = match &slot.kind {
            SlotKind::Counters(plan) => Arc::clone(plan),
            SlotKind::Options { record_len } => {
                let n = body.len() / record_len;
                self.stats.options_records += n as u64;
                return n as u32;
            }
            SlotKind::Withdrawn => {
                self.stats.count(Malformed::UnknownTemplate);
                self.stats.unknown_template_bytes += body.len() as u64;
                return 0;
            }
        };
        slot.used = self.clock;
        let (s, part) = (slot.session, slot.part);
        self.sessions[s].used = self.clock;
        let rec_len = plan.record_len;
        let n = body.len() / rec_len;
        let trailing = body.len() - n * rec_len;
        if n == 0 {
            self.stats.count(Malformed::RecordWiderThanSet);
            self.stats.discarded_bytes += body.len() as u64;
            return 0;
        }
        self.stats.padding_bytes += trailing as u64;
        if self.sessions[s].builder.is_none() {
            let schema = self.schema_for(s, domain);
            let rows = self.rows_per_batch(schema.width());
            // Values, timestamps and part masks; twice: the builder keeps a spare set.
            let bytes = 2 * rows * (8 * schema.width() + 12);
            self.make_builder_room(s, bytes, sink);
            self.sessions[s].builder = Some(BatchBuilder::new(schema, rows));
            self.sessions[s].builder_bytes = bytes;
            self.builder_bytes += bytes;
        }
        let bswap = self.bswap;
        let mut done = 0;
        while done < n {
            let builder = self.sessions[s].builder.as_mut().expect("created above");
            // Decode as many records as fit without a batch boundary, then flush and go on.
            while done < n {
                let rec = &body[done * rec_len..(done + 1) * rec_len];
                let ts = plan.timestamp(rec);
                let Some(dst) = builder.part_mut(ts, part) else {
                    break;
                };
                plan.decode_counters(rec, dst, bswap);
                done += 1;
            }
            if done < n || builder.is_full() {
                self.flush_session(s, sink);
            }
        }
        self.stats.records += n as u64;
        self.stats.counters += (n * plan.width) as u64;
        n as u32
    }
}

/// Checks a session exactly as [`Decoder::register_session`] would (labels, templates, parts)
/// without registering it; returns its template IDs in order. The session registry calls this
/// before it touches the filter or a decoder, so a session a decoder would refuse changes
/// nothing.
///
/// # Errors
/// See [`SessionError`].
pub fn validate_session(
    spec: &SessionSpec,
    session_config: &[u8],
) -> Result<Vec<u16>, SessionError> {
    Ok(compile_session(spec, session_config)?
        .into_iter()
        .map(|(t, _)| t)
        .collect())
}

type Parts = Vec<(u16, Option<Arc<DecodePlan>>)>;

fn compile_session(spec: &SessionSpec, templates: &[u8]) -> Result<Parts, SessionError> {
    if spec.object_names.len() != spec.object_ids.len() {
        return Err(SessionError::LabelCountMismatch {
            names: spec.object_names.len(),
            ids: spec.object_ids.len(),
        });
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(d) = spec.object_ids.iter().find(|id| !seen.insert(**id)) {
        return Err(SessionError::DuplicateLabel(*d));
    }
    let recs = parse_template_messages(templates)?;
    if recs.is_empty() {
        return Err(SessionError::NoTemplates);
    }
    if recs.len() > MAX_PARTS {
        return Err(SessionError::TooManyParts(recs.len()));
    }
    let mut tids = std::collections::HashSet::new();
    let mut plans = Vec::with_capacity(recs.len());
    for r in &recs {
        if !tids.insert(r.template_id) {
            return Err(SessionError::DuplicateTemplate(r.template_id));
        }
        plans.push((r.template_id, Some(Arc::new(r.compile()?))));
    }
    Ok(plans)
}

/// The template IDs a `session_config` (one or more IPFIX template messages) defines, in order:
/// what the control plane registers in the template filter.
///
/// # Errors
/// The bytes are not a sequence of valid template messages.
pub fn session_template_ids(session_config: &[u8]) -> Result<Vec<u16>, SessionError> {
    Ok(parse_template_messages(session_config)?
        .iter()
        .map(|r| r.template_id)
        .collect())
}

fn parse_template_messages(b: &[u8]) -> Result<Vec<TemplateRecord>, SessionError> {
    match TemplateMessages::parse(b) {
        Ok(m) => Ok(m.records),
        Err(ConfigError::Template(e)) => Err(SessionError::Template(e)),
        Err(e) => Err(SessionError::BadConfig(e)),
    }
}

#[cfg(test)]
mod tests;

/// The round trip tests and tools compare against: the first `snapshots` snapshots of `cfg`'s
/// stream, encoded as IPFIX and decoded by the daemon's [`Decoder`],
/// as one batch of exactly `snapshots` rows (what a daemon fed this config was sent). Every
/// part of a split group is present here, so the batch carries no part masks.
pub fn emulated(
    cfg: stel_emu::EmuConfig,
    snapshots: u64,
) -> Result<stel_store::CounterBatch, String> {
    use stel_store::CounterBatch;
    let mut emu = stel_emu::Emulator::new(cfg)?;
    let mut dec = Decoder::new(DecodeConfig::default());
    let mut batches: Vec<CounterBatch> = Vec::new();
    dec.register_session(
        emu.session_spec(),
        &emu.session_config(),
        &mut |b: CounterBatch| batches.push(b),
    )
    .map_err(|e| format!("register the emulator's session: {e}"))?;
    let mut buf = Vec::new();
    while emu.snapshots() < snapshots {
        buf.clear();
        emu.data_message(&mut buf);
        dec.decode(&buf, &mut |b: CounterBatch| batches.push(b));
    }
    dec.flush(&mut |b: CounterBatch| batches.push(b));
    let schema = match batches.first() {
        Some(b) => std::sync::Arc::clone(&b.schema),
        None => return Err("the decoder emitted no batch".into()),
    };
    let n = snapshots as usize;
    let mut ts: Vec<i64> = batches.iter().flat_map(|b| b.ts.iter().copied()).collect();
    let mut values: Vec<u64> = batches
        .iter()
        .flat_map(|b| b.values.iter().copied())
        .collect();
    if ts.len() < n {
        return Err(format!("decoded {} of {n} snapshots", ts.len()));
    }
    ts.truncate(n);
    values.truncate(n * schema.width());
    CounterBatch::new(schema, ts, values, Vec::new()).map_err(|e| e.to_string())
}
