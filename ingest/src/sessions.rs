//! The session registry: the one owner of what sessions exist, and the only code that changes
//! the template filter and the decoders' sessions together.
//!
//! ```text
//!  STATE_DB watcher ─┐                       ┌─▶ template filter (eBPF map / user space)   1. insert new IDs
//!  session files ────┼─▶ SessionRegistry ────┤                                               (roll back on failure)
//!  demo / benches ───┘   (reader thread)     └─▶ decoder rings: Control::Register{ticket}  2. in order with data
//!                              ▲                                                         │
//!                              └──────── ControlReply{ticket} (polled, never awaited) ◀──┘ 3. ack
//! ```
//!
//! A [`Session`] is `{profile, group, domain, template ids, names}`, keyed by (profile, group).
//! [`SessionRegistry::register`]:
//! 1. validates the session exactly as a decoder would ([`crate::decode::validate_session`]) and
//!    refuses a template ID another session already uses in the same domain;
//! 2. computes what changes in the filter (IDs no other session holds) and applies it; if any
//!    insert fails (e.g. the map is full), the ones it made are removed again, and nothing else
//!    has been touched — the failed session leaves no trace anywhere;
//! 3. queues the registration for the decoder that owns the domain, in the same ring as the
//!    data ([`crate::pipeline`]), so it applies between the datagrams before and after it;
//! 4. records the session as `applying` and returns at once: the reader never waits.
//!
//! The decoder's answer comes back on a channel; [`SessionRegistry::poll`] (called every
//! receive round) marks the session `active` and runs its acknowledgement (STATE_DB's
//! `config_version` + 1). A session a decoder refused despite validation (a bug) is rolled back
//! the same way as a filter failure and acknowledged as rejected.
//!
//! The filter map is keyed by template ID alone (the kernel program cannot afford more), so IDs
//! are reference-counted across domains: an ID leaves the map when the last session using it
//! goes.
use std::collections::{BTreeMap, HashMap};

use crate::{
    decode::{self, SessionSpec},
    filter::{FilterError, TemplateFilter},
    pipeline::{Control, ControlReply, Pipeline},
};

/// Runs once a registration was applied by its decoder (`Ok`) or refused (`Err(reason)`).
pub(crate) type Ack = Box<dyn FnOnce(Result<(), String>) + Send>;

/// Why a session was not registered. Nothing was changed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    /// The names or templates are invalid.
    #[error("session {profile}/{group}: {source}")]
    Invalid {
        profile: String,
        group: String,
        #[source]
        source: decode::SessionError,
    },
    /// Another session already has the template in this domain.
    #[error(
        "session {profile}/{group}: template {template} of domain {domain} belongs to session \
         {other_profile}/{other_group}; remove that session first"
    )]
    Conflict {
        profile: String,
        group: String,
        domain: u32,
        template: u16,
        other_profile: String,
        other_group: String,
    },
    /// The template filter refused an ID (everything this registration inserted was removed).
    #[error("session {profile}/{group}: template filter: {source}")]
    Filter {
        profile: String,
        group: String,
        #[source]
        source: Box<FilterError>,
    },
}

/// Where a session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SessionState {
    /// Filter updated, the decoder has not answered yet.
    Applying,
    /// The decoder applied it.
    Active,
}

/// One registered session.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Session {
    pub profile: String,
    pub group: String,
    /// IPFIX observation domain of its exporter.
    pub domain: u32,
    /// Its templates, in snapshot order.
    pub template_ids: Vec<u16>,
    /// Object names, positionally paired with `object_ids`.
    pub object_names: Vec<String>,
    pub object_ids: Vec<u16>,
    pub state: SessionState,
    #[serde(skip)]
    ticket: u64,
}

/// The registry's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SessionStats {
    /// Sessions registered now.
    pub sessions: usize,
    /// Registrations accepted (filter updated, decoder asked).
    pub registrations_total: u64,
    /// Registrations a decoder confirmed.
    pub applied_total: u64,
    /// Unregistrations of a known session.
    pub unregistrations_total: u64,
    /// Registrations refused (invalid, conflicting, filter full): nothing changed.
    pub rejected_total: u64,
    /// Filter inserts undone because a later insert of the same registration failed.
    pub filter_rollbacks_total: u64,
    /// Filter removals that failed (the ID stays in the map: more data is kept, none lost).
    pub filter_remove_errors_total: u64,
    /// Registrations waiting for their decoder.
    pub applying: usize,
}

struct Pending {
    profile: String,
    group: String,
    ack: Option<Ack>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("profile", &self.profile)
            .field("group", &self.group)
            .field("ack", &self.ack.is_some())
            .finish()
    }
}

impl std::fmt::Debug for SessionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRegistry")
            .field("sessions", &self.sessions.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The registry (see the module docs). Lives on the reader thread.
#[derive(Default)]
pub(crate) struct SessionRegistry {
    sessions: BTreeMap<(String, String), Session>,
    /// Template ID → sessions using it (in any domain).
    refs: HashMap<u16, u32>,
    pending: HashMap<u64, Pending>,
    next_ticket: u64,
    stats: SessionStats,
    replies: Vec<ControlReply>,
}

impl SessionRegistry {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) `spec`'s session: see the module docs. `ack` runs once the
    /// decoder applied it (or refused it). Never blocks.
    ///
    /// # Errors
    /// [`SessionError`]; nothing changed, and `ack` is dropped without being called.
    pub(crate) fn register(
        &mut self,
        spec: SessionSpec,
        session_config: Vec<u8>,
        filter: &mut TemplateFilter,
        pipeline: &mut Pipeline,
        ack: Option<Ack>,
    ) -> Result<(), SessionError> {
        let r = self.try_register(spec, session_config, filter, pipeline, ack);
        if r.is_err() {
            self.stats.rejected_total += 1;
        }
        r
    }

    fn try_register(
        &mut self,
        spec: SessionSpec,
        session_config: Vec<u8>,
        filter: &mut TemplateFilter,
        pipeline: &mut Pipeline,
        ack: Option<Ack>,
    ) -> Result<(), SessionError> {
        let key = (spec.profile.clone(), spec.group.clone());
        let tids = decode::validate_session(&spec, &session_config).map_err(|source| {
            SessionError::Invalid {
                profile: key.0.clone(),
                group: key.1.clone(),
                source,
            }
        })?;
        for (k, s) in &self.sessions {
            if *k == key || s.domain != spec.domain {
                continue;
            }
            if let Some(&t) = tids.iter().find(|t| s.template_ids.contains(t)) {
                return Err(SessionError::Conflict {
                    profile: key.0,
                    group: key.1,
                    domain: spec.domain,
                    template: t,
                    other_profile: s.profile.clone(),
                    other_group: s.group.clone(),
                });
            }
        }
        let (old_ids, old_domain) = match self.sessions.get(&key) {
            Some(o) => (o.template_ids.clone(), Some(o.domain)),
            None => (Vec::new(), None),
        };
        // 1. Filter inserts, all or nothing.
        let add: Vec<u16> = tids
            .iter()
            .copied()
            .filter(|t| self.refs.get(t).copied().unwrap_or(0) == 0)
            .collect();
        for (i, &t) in add.iter().enumerate() {
            if let Err(source) = filter.register(t) {
                for &u in &add[..i] {
                    if filter.unregister(u).is_err() {
                        self.stats.filter_remove_errors_total += 1;
                    }
                    self.stats.filter_rollbacks_total += 1;
                }
                return Err(SessionError::Filter {
                    profile: key.0,
                    group: key.1,
                    source: Box::new(source),
                });
            }
        }
        // 2. From here on nothing can fail. The old version's IDs nobody else holds leave.
        for &t in &old_ids {
            self.unref(t, filter, &tids);
        }
        for &t in &tids {
            *self.refs.entry(t).or_default() += 1;
        }
        // 3. The decoders, in order with the data.
        if let Some(d) = old_domain.filter(|&d| pipeline.shard(d) != pipeline.shard(spec.domain)) {
            pipeline.control(Control::Unregister {
                profile: key.0.clone(),
                group: key.1.clone(),
                domain: d,
            });
        }
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        let session = Session {
            profile: key.0.clone(),
            group: key.1.clone(),
            domain: spec.domain,
            template_ids: tids,
            object_names: spec.object_names.clone(),
            object_ids: spec.object_ids.clone(),
            state: SessionState::Applying,
            ticket,
        };
        tracing::info!(
            profile = %session.profile,
            group = %session.group,
            domain = session.domain,
            templates = ?session.template_ids,
            replaced = old_domain.is_some(),
            "Session registered."
        );
        pipeline.control(Control::Register {
            spec,
            session_config,
            ticket,
        });
        self.pending.insert(
            ticket,
            Pending {
                profile: key.0.clone(),
                group: key.1.clone(),
                ack,
            },
        );
        self.sessions.insert(key, session);
        self.stats.registrations_total += 1;
        Ok(())
    }

    /// Drops one reference to `t`; removes it from the filter when it was the last and `keep`
    /// does not hold it.
    fn unref(&mut self, t: u16, filter: &mut TemplateFilter, keep: &[u16]) {
        let n = self.refs.entry(t).or_default();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.refs.remove(&t);
            if !keep.contains(&t) {
                if let Err(e) = filter.unregister(t) {
                    self.stats.filter_remove_errors_total += 1;
                    tracing::warn!(template = t, error = %e, "Template filter removal failed; its data stays kept.");
                }
            }
        }
    }

    /// Unregisters a session: its template IDs no other session holds leave the filter, its
    /// decoder flushes and forgets it (in order with the data). Returns whether it existed.
    pub(crate) fn unregister(
        &mut self,
        profile: &str,
        group: &str,
        filter: &mut TemplateFilter,
        pipeline: &mut Pipeline,
    ) -> bool {
        let Some(s) = self
            .sessions
            .remove(&(profile.to_string(), group.to_string()))
        else {
            return false;
        };
        for &t in &s.template_ids {
            self.unref(t, filter, &[]);
        }
        pipeline.control(Control::Unregister {
            profile: s.profile.clone(),
            group: s.group.clone(),
            domain: s.domain,
        });
        tracing::info!(profile = %s.profile, group = %s.group, "Session unregistered.");
        self.stats.unregistrations_total += 1;
        true
    }

    /// Takes the decoders' answers: applied sessions become active and are acknowledged. Call
    /// every receive round; never blocks.
    pub(crate) fn poll(&mut self, filter: &mut TemplateFilter, pipeline: &mut Pipeline) {
        let mut replies = std::mem::take(&mut self.replies);
        pipeline.poll_replies(&mut replies);
        for r in replies.drain(..) {
            let Some(p) = self.pending.remove(&r.ticket) else {
                continue;
            };
            let key = (p.profile, p.group);
            let current = self
                .sessions
                .get(&key)
                .is_some_and(|s| s.ticket == r.ticket);
            match &r.result {
                Ok(()) => {
                    self.stats.applied_total += 1;
                    if current {
                        if let Some(s) = self.sessions.get_mut(&key) {
                            s.state = SessionState::Active;
                        }
                    }
                }
                Err(e) if current => {
                    // Validation passed but the decoder refused: undo everything.
                    tracing::error!(
                        profile = %key.0,
                        group = %key.1,
                        error = %e,
                        "A decoder refused a validated session; rolled back."
                    );
                    self.unregister(&key.0, &key.1, filter, pipeline);
                    self.stats.unregistrations_total -= 1;
                    self.stats.rejected_total += 1;
                }
                Err(_) => {}
            }
            if let Some(ack) = p.ack {
                ack(r.result);
            }
        }
        self.replies = replies;
    }

    /// Number of sessions.
    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Counters.
    pub(crate) fn stats(&self) -> SessionStats {
        SessionStats {
            sessions: self.sessions.len(),
            applying: self.pending.len(),
            ..self.stats
        }
    }
}
