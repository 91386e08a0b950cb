//! Resolution and watching, through [`crate::sys::netlink`]: [`resolve`] (one GETFAMILY),
//! [`FamilyWatcher`] (nlctrl's `notify` group, resolved by name) and [`GenlSource`], the small
//! state machine that keeps the data socket in the family's multicast group.
//!
//! # Troubleshooting
//! - Stuck at "waiting for family sonic_stel" while `genl ctrl list` shows it: the daemon runs in
//!   a network namespace other than the initial one and the family is not `netnsok`; nlctrl
//!   answers ENOENT there and sends its notifications only to the initial namespace.
//! - Rejoining fails with EPERM after capabilities were dropped: the vendor flagged the group
//!   GENL_MCAST_CAP_NET_ADMIN / GENL_MCAST_CAP_SYS_ADMIN (6.7+); keep CAP_NET_ADMIN.

use std::{
    fmt, io,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use super::{
    getfamily_request, parse_datagram, CtrlEvent, FamilyInfo, GenlConfig, Message, NLCTRL_FAMILY,
    NLCTRL_NOTIFY_GROUP,
};
use crate::sys::{netlink::NetlinkSocket, SysError};
use stel_store::log_limit::LogLimiter;

/// nlctrl builds replies and notifications in an NLMSG_DEFAULT_SIZE skb (≤ 8 KiB); 64 KiB leaves
/// room for any page size, and a longer datagram is reported as truncated, never half-parsed.
const CTRL_BUF: usize = 64 << 10;
/// How long [`resolve`] waits for the reply. The kernel queues it before `sendto` returns (the
/// handler runs in the sender's context), so this only bounds a lost reply (ENOBUFS).
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);
const GETFAMILY: &str = "nlctrl CTRL_CMD_GETFAMILY";

static SEQ: AtomicU32 = AtomicU32::new(1);

fn invalid(call: &'static str, kind: io::ErrorKind, e: impl fmt::Display) -> SysError {
    SysError {
        call,
        source: io::Error::new(kind, e.to_string()),
    }
}

/// Looks `family` up with CTRL_CMD_GETFAMILY on `sock`, a NETLINK_GENERIC socket that has
/// joined no multicast group (anything else queued on it is read and dropped). `Ok(None)` when
/// nlctrl answers ENOENT: the family is not registered (or, from a non-initial network
/// namespace, not `netnsok`).
///
/// # Errors
/// An invalid name (`InvalidInput`), `sendto`/`recv` failing, any other nlctrl error (as its
/// errno), a truncated or malformed reply (`InvalidData`), no reply within 2 s (`TimedOut`).
pub fn resolve(sock: &NetlinkSocket, family: &str) -> Result<Option<FamilyInfo>, SysError> {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let req = getfamily_request(family, seq)
        .map_err(|e| invalid(GETFAMILY, io::ErrorKind::InvalidInput, e))?;
    sock.send_to_kernel(&req)?;
    let mut buf = vec![0u8; CTRL_BUF];
    let deadline = Instant::now() + REPLY_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(invalid(GETFAMILY, io::ErrorKind::TimedOut, "no reply"));
        }
        if !sock.wait_readable(left)? {
            continue;
        }
        let Some((n, real)) = sock.try_recv(&mut buf)? else {
            continue;
        };
        if real > n {
            return Err(invalid(
                GETFAMILY,
                io::ErrorKind::InvalidData,
                format_args!("reply of {real} bytes truncated to {n}"),
            ));
        }
        for m in parse_datagram(&buf[..n]) {
            match m.map_err(|e| invalid(GETFAMILY, io::ErrorKind::InvalidData, e))? {
                Message::Ctrl {
                    seq: s,
                    event: CtrlEvent::NewFamily(info),
                } if s == seq => return Ok(Some(info)),
                Message::Error { seq: s, errno } if s == seq && errno != 0 => {
                    if errno == libc::ENOENT {
                        return Ok(None);
                    }
                    return Err(SysError {
                        call: GETFAMILY,
                        source: io::Error::from_raw_os_error(errno),
                    });
                }
                // A reply to an earlier request that timed out, or an ACK: not ours.
                _ => {}
            }
        }
    }
}

/// What one [`FamilyWatcher::poll`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watched {
    /// nlctrl notifications about the watched family, in kernel order.
    pub events: Vec<CtrlEvent>,
    /// Notifications may have been lost (ENOBUFS, a truncated or malformed datagram): the
    /// caller should re-resolve now instead of trusting `events` to be complete.
    pub overrun: bool,
}

/// Follows nlctrl's notifications about one family, on sockets of its own.
///
/// Two NETLINK_GENERIC sockets: `notify` has joined nlctrl's `notify` group (resolved by name,
/// never a hard-coded ID), `ctrl` joins nothing and carries GETFAMILY requests so replies and
/// notifications never interleave. The notify socket is joined before anything is resolved, so
/// a family registered in between is seen either by the lookup or as a notification.
#[derive(Debug)]
pub struct FamilyWatcher {
    family: String,
    ctrl: NetlinkSocket,
    notify: NetlinkSocket,
    notify_group: u32,
    buf: Vec<u8>,
    notifications: u64,
    overruns: u64,
}

impl FamilyWatcher {
    /// Opens the sockets, resolves nlctrl's `notify` group and joins it.
    ///
    /// # Errors
    /// `family` is not a valid name (`InvalidInput`), socket calls failing, nlctrl (or its
    /// notify group) not found (`NotFound`).
    pub fn new(family: &str) -> Result<Self, SysError> {
        super::check_name(family)
            .map_err(|e| invalid("FamilyWatcher::new", io::ErrorKind::InvalidInput, e))?;
        let ctrl = NetlinkSocket::generic()?;
        let nlctrl = resolve(&ctrl, NLCTRL_FAMILY)?
            .ok_or_else(|| invalid(GETFAMILY, io::ErrorKind::NotFound, "no family nlctrl"))?;
        let notify_group = nlctrl.group_id(NLCTRL_NOTIFY_GROUP).ok_or_else(|| {
            invalid(
                GETFAMILY,
                io::ErrorKind::NotFound,
                "nlctrl has no multicast group notify",
            )
        })?;
        let notify = NetlinkSocket::generic()?;
        notify.join_group(notify_group)?;
        Ok(Self {
            family: family.to_owned(),
            ctrl,
            notify,
            notify_group,
            buf: vec![0u8; CTRL_BUF],
            notifications: 0,
            overruns: 0,
        })
    }

    /// The watched family's name.
    pub fn family(&self) -> &str {
        &self.family
    }

    /// nlctrl's notify group ID as resolved (0x10 on every kernel seen so far).
    pub fn notify_group(&self) -> u32 {
        self.notify_group
    }

    /// The socket notifications arrive on, for a caller that wants to wait on it in its own
    /// poll/epoll set; read it only through [`poll`](Self::poll).
    pub fn notify_socket(&self) -> &NetlinkSocket {
        &self.notify
    }

    /// Looks the watched family up now (see [`resolve`]).
    ///
    /// # Errors
    /// As [`resolve`].
    pub fn resolve(&self) -> Result<Option<FamilyInfo>, SysError> {
        resolve(&self.ctrl, &self.family)
    }

    /// Looks any family up on this watcher's request socket.
    ///
    /// # Errors
    /// As [`resolve`].
    pub fn resolve_family(&self, family: &str) -> Result<Option<FamilyInfo>, SysError> {
        resolve(&self.ctrl, family)
    }

    /// Waits up to `timeout` (zero: just check) for notifications, then drains every queued one
    /// without blocking. Events about other families are dropped.
    ///
    /// # Errors
    /// `poll`/`recv` failing with anything but ENOBUFS (which sets [`Watched::overrun`]).
    pub fn poll(&mut self, timeout: Duration) -> Result<Watched, SysError> {
        let mut out = Watched::default();
        if !self.notify.wait_readable(timeout)? {
            return Ok(out);
        }
        loop {
            let (n, real) = match self.notify.try_recv(&mut self.buf) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) if e.source.raw_os_error() == Some(libc::ENOBUFS) => {
                    out.overrun = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if real > n {
                out.overrun = true;
                continue;
            }
            for m in parse_datagram(&self.buf[..n]) {
                match m {
                    Ok(Message::Ctrl { event, .. }) => {
                        self.notifications += 1;
                        if event.family_name() == self.family {
                            out.events.push(event);
                        }
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "Malformed nlctrl notification; re-resolving.");
                        out.overrun = true;
                    }
                }
            }
        }
        if out.overrun {
            self.overruns += 1;
        }
        Ok(out)
    }

    /// nlctrl notifications parsed (all families), and polls that found some lost.
    pub fn counts(&self) -> (u64, u64) {
        (self.notifications, self.overruns)
    }
}

/// How [`GenlSource`] finds and follows the data family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenlSourceConfig {
    /// Family and multicast group names (from constants.yml).
    pub genl: GenlConfig,
    /// Backstop: re-resolve the family and check the data socket's membership this often, in
    /// case a notification was missed. Notifications make the normal case immediate.
    pub resync_interval: Duration,
}

impl Default for GenlSourceConfig {
    fn default() -> Self {
        Self {
            genl: GenlConfig::default(),
            resync_interval: Duration::from_secs(5),
        }
    }
}

/// A transition of the data socket reported by [`GenlSource::poll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// First join: data can flow.
    Joined { family_id: u16, group_id: u32 },
    /// The family (or its group) went away: the data socket is idle. Data still queued on it
    /// was received before the loss and is valid.
    Lost { family_id: u16, group_id: u32 },
    /// Joined again after a loss, a missed remove/re-add, or an ID change. The exporter
    /// restarted: expect new templates and a new IPFIX sequence.
    Rejoined { family_id: u16, group_id: u32 },
}

/// Where [`GenlSource`] stands, for the status line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenlStatus {
    /// The family is not registered.
    Waiting { family: String },
    /// The family exists without the configured group.
    NoGroup {
        family: String,
        family_id: u16,
        group: String,
    },
    /// The data socket is in the group.
    Joined {
        family: String,
        family_id: u16,
        group: String,
        group_id: u32,
    },
}

impl fmt::Display for GenlStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Waiting { family } => write!(f, "waiting for family {family}"),
            Self::NoGroup {
                family,
                family_id,
                group,
            } => write!(
                f,
                "family {family} (id {family_id:#x}) has no multicast group {group}"
            ),
            Self::Joined {
                family,
                family_id,
                group,
                group_id,
            } => write!(
                f,
                "joined {family}/{group} (family id {family_id:#x}, group {group_id})"
            ),
        }
    }
}

/// Counters for the status command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenlCounters {
    pub joins: u64,
    pub losses: u64,
    pub rejoins: u64,
    /// Backstop lookups done (periodic or after an overrun).
    pub resyncs: u64,
    /// Times the backstop (not a notification) found the state changed: notifications missed.
    pub resync_repairs: u64,
    /// nlctrl notifications parsed, any family.
    pub notifications: u64,
    /// Polls on which notifications were lost.
    pub overruns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    NoGroup { family_id: u16 },
    Joined { family_id: u16, group_id: u32 },
}

/// Keeps a data socket in the configured family's multicast group across the family's
/// absence, removal and re-registration.
///
/// Drive it from one thread (a control thread, or the reader between batches):
/// `poll(&data, timeout)` after [`new`](Self::new) — the first call resolves at once — and then
/// in a loop. It joins and leaves the group on `data` itself and reports transitions; the data
/// socket is only touched through NETLINK_ADD/DROP_MEMBERSHIP, which is safe while another
/// thread receives on it.
#[derive(Debug)]
pub struct GenlSource {
    cfg: GenlSourceConfig,
    watcher: FamilyWatcher,
    state: State,
    ever_joined: bool,
    next_resync: Instant,
    counters: GenlCounters,
    waiting_log: LogLimiter,
    error_log: LogLimiter,
}

impl GenlSource {
    /// Opens the nlctrl watcher for `cfg.genl.family`. Does not resolve the family yet and does
    /// not touch any data socket: the first [`poll`](Self::poll) does.
    ///
    /// # Errors
    /// As [`FamilyWatcher::new`]; the group name is checked too (`InvalidInput`).
    pub fn new(cfg: GenlSourceConfig) -> Result<Self, SysError> {
        super::check_name(&cfg.genl.group)
            .map_err(|e| invalid("GenlSource::new", io::ErrorKind::InvalidInput, e))?;
        let watcher = FamilyWatcher::new(&cfg.genl.family)?;
        Ok(Self {
            cfg,
            watcher,
            state: State::Waiting,
            ever_joined: false,
            next_resync: Instant::now(),
            counters: GenlCounters::default(),
            waiting_log: LogLimiter::new(Duration::from_secs(60)),
            error_log: LogLimiter::new(Duration::from_secs(60)),
        })
    }

    /// Waits up to `timeout` for nlctrl notifications, applies them and, when due (or when
    /// notifications were lost), the backstop lookup; joins or leaves the data group on `data`.
    /// Returns the net transition of this call, if any (a removal and re-registration seen in one
    /// call is one `Rejoined`).
    ///
    /// # Errors
    /// A syscall failing (nlctrl lookup, join/leave on `data`). The state stays consistent (a
    /// failed join leaves the source not joined) and the next call retries within a second.
    pub fn poll(
        &mut self,
        data: &NetlinkSocket,
        timeout: Duration,
    ) -> Result<Option<Change>, SysError> {
        let (before, had_joined) = (self.state, self.ever_joined);
        let mut cycled = false;
        let r = self.poll_inner(data, timeout, &mut cycled);
        if let Err(error) = &r {
            self.next_resync = self
                .next_resync
                .min(Instant::now() + Duration::from_secs(1));
            if let Some(held) = self.error_log.allow() {
                tracing::warn!(%error, held, family = %self.cfg.genl.family,
                    "Generic netlink control failed; retrying.");
            }
        }
        let change = self.change(before, had_joined, cycled);
        // A change is reported even when a later step of the same call failed: the join or
        // leave it describes did happen.
        match (r, change) {
            (Err(e), None) => Err(e),
            _ => Ok(change),
        }
    }

    fn poll_inner(
        &mut self,
        data: &NetlinkSocket,
        timeout: Duration,
        cycled: &mut bool,
    ) -> Result<(), SysError> {
        // Before a resync is due, only wait as long as that.
        let until_resync = self.next_resync.saturating_duration_since(Instant::now());
        let w = self.watcher.poll(timeout.min(until_resync))?;
        for ev in w.events {
            self.apply(ev, data, cycled, false)?;
        }
        let now = Instant::now();
        if w.overrun || now >= self.next_resync {
            self.next_resync = now + self.cfg.resync_interval;
            self.resync(data, cycled)?;
        }
        Ok(())
    }

    /// The net transition from `before` (and whether the source had ever joined then) to now;
    /// counted.
    fn change(&mut self, before: State, had_joined: bool, cycled: bool) -> Option<Change> {
        let change = match (before, self.state) {
            (
                State::Joined {
                    family_id: f0,
                    group_id: g0,
                },
                State::Joined {
                    family_id,
                    group_id,
                },
            ) => (cycled || f0 != family_id || g0 != group_id).then_some(Change::Rejoined {
                family_id,
                group_id,
            }),
            (
                State::Joined {
                    family_id,
                    group_id,
                },
                _,
            ) => Some(Change::Lost {
                family_id,
                group_id,
            }),
            (
                _,
                State::Joined {
                    family_id,
                    group_id,
                },
            ) => Some(if !had_joined {
                Change::Joined {
                    family_id,
                    group_id,
                }
            } else {
                Change::Rejoined {
                    family_id,
                    group_id,
                }
            }),
            _ => None,
        };
        match change {
            Some(Change::Joined { .. }) => self.counters.joins += 1,
            Some(Change::Lost { .. }) => self.counters.losses += 1,
            Some(Change::Rejoined { .. }) => self.counters.rejoins += 1,
            None => {}
        }
        change
    }

    /// One backstop lookup.
    fn resync(&mut self, data: &NetlinkSocket, cycled: &mut bool) -> Result<(), SysError> {
        self.counters.resyncs += 1;
        let (before, cycled_before) = (self.state, *cycled);
        match self.watcher.resolve()? {
            Some(info) => self.apply(CtrlEvent::NewFamily(info), data, cycled, true)?,
            None => {
                if before != State::Waiting {
                    let id = match before {
                        State::NoGroup { family_id } | State::Joined { family_id, .. } => family_id,
                        State::Waiting => 0,
                    };
                    self.apply(
                        CtrlEvent::DelFamily {
                            name: self.cfg.genl.family.clone(),
                            id,
                        },
                        data,
                        cycled,
                        true,
                    )?;
                }
                let now = Instant::now();
                if let Some(held) = self.waiting_log.allow_at(now) {
                    tracing::info!(family = %self.cfg.genl.family, held,
                        "Waiting for generic netlink family.");
                }
            }
        }
        // The first lookup is the start, not a repair.
        let repaired = self.state != before || (*cycled && !cycled_before);
        if repaired && self.counters.resyncs > 1 {
            self.counters.resync_repairs += 1;
        }
        Ok(())
    }

    fn join(
        &mut self,
        data: &NetlinkSocket,
        family_id: u16,
        group_id: u32,
    ) -> Result<(), SysError> {
        if let State::Joined { group_id: old, .. } = self.state {
            if old != group_id {
                data.leave_group(old)?;
            }
        }
        // Record "not joined" first so a failed join never leaves a stale Joined state.
        self.state = State::NoGroup { family_id };
        data.join_group(group_id)?;
        self.state = State::Joined {
            family_id,
            group_id,
        };
        self.ever_joined = true;
        self.waiting_log.reset();
        Ok(())
    }

    fn leave(&mut self, data: &NetlinkSocket, next: State) -> Result<(), SysError> {
        let prev = self.state;
        self.state = next;
        if let State::Joined { group_id, .. } = prev {
            data.leave_group(group_id)?;
        }
        Ok(())
    }

    fn apply(
        &mut self,
        ev: CtrlEvent,
        data: &NetlinkSocket,
        cycled: &mut bool,
        from_resync: bool,
    ) -> Result<(), SysError> {
        let group = self.cfg.genl.group.clone();
        let family = self.cfg.genl.family.clone();
        let via = if from_resync {
            "periodic lookup"
        } else {
            "nlctrl notification"
        };
        match ev {
            CtrlEvent::NewFamily(info) => match (self.state, info.group_id(&group)) {
                (
                    State::Joined {
                        family_id,
                        group_id,
                    },
                    Some(g),
                ) if family_id == info.id && group_id == g => {
                    // Same IDs. Still a member? A missed remove + re-add that handed the same
                    // IDs back leaves us silently out of the group (the kernel clears members).
                    if !data.memberships()?.contains(&g) {
                        tracing::warn!(%family, %group, family_id, group_id = g, via,
                            "Data socket was no longer in the multicast group; rejoining.");
                        self.join(data, info.id, g)?;
                        *cycled = true;
                    }
                }
                (old, Some(g)) => {
                    self.join(data, info.id, g)?;
                    if let State::Joined {
                        family_id,
                        group_id,
                    } = old
                    {
                        *cycled = true;
                        tracing::warn!(%family, %group, old_family_id = family_id,
                            old_group_id = group_id, family_id = info.id, group_id = g, via,
                            "Generic netlink family re-registered; rejoined its multicast group.");
                    } else {
                        tracing::info!(%family, %group, family_id = info.id, group_id = g, via,
                            "Joined generic netlink multicast group.");
                    }
                }
                (old, None) => {
                    self.leave(data, State::NoGroup { family_id: info.id })?;
                    if old != self.state {
                        let groups: Vec<&str> =
                            info.groups.iter().map(|(n, _)| n.as_str()).collect();
                        tracing::error!(%family, %group, family_id = info.id, ?groups, via,
                            "Generic netlink family has no such multicast group; receiving nothing.");
                    }
                }
            },
            CtrlEvent::DelFamily { id, .. } => {
                if self.state != State::Waiting {
                    self.leave(data, State::Waiting)?;
                    tracing::warn!(%family, family_id = id, via,
                        "Generic netlink family removed; data socket idle until it returns.");
                }
            }
            CtrlEvent::NewGroup {
                family_id,
                group: g,
                group_id,
                ..
            } if g == group => {
                let same = self.state
                    == State::Joined {
                        family_id,
                        group_id,
                    };
                if !same {
                    let old = self.state;
                    self.join(data, family_id, group_id)?;
                    if matches!(old, State::Joined { .. }) {
                        *cycled = true;
                    }
                    tracing::info!(%family, %group, family_id, group_id, via,
                        "Joined generic netlink multicast group.");
                }
            }
            CtrlEvent::DelGroup {
                family_id,
                group: g,
                ..
            } if g == group => {
                if matches!(self.state, State::Joined { .. }) {
                    self.leave(data, State::NoGroup { family_id })?;
                    tracing::warn!(%family, %group, family_id, via,
                        "Generic netlink multicast group removed; data socket idle.");
                }
            }
            CtrlEvent::NewGroup { .. } | CtrlEvent::DelGroup { .. } => {}
        }
        Ok(())
    }

    /// Where the source stands ("waiting for family sonic_stel", ...).
    pub fn status(&self) -> GenlStatus {
        let family = self.cfg.genl.family.clone();
        let group = self.cfg.genl.group.clone();
        match self.state {
            State::Waiting => GenlStatus::Waiting { family },
            State::NoGroup { family_id } => GenlStatus::NoGroup {
                family,
                family_id,
                group,
            },
            State::Joined {
                family_id,
                group_id,
            } => GenlStatus::Joined {
                family,
                family_id,
                group,
                group_id,
            },
        }
    }

    /// True while the data socket is in the group.
    pub fn is_joined(&self) -> bool {
        matches!(self.state, State::Joined { .. })
    }

    /// Counters for the status command.
    pub fn counters(&self) -> GenlCounters {
        let (notifications, overruns) = self.watcher.counts();
        GenlCounters {
            notifications,
            overruns,
            ..self.counters
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &GenlSourceConfig {
        &self.cfg
    }

    /// The watcher, e.g. to wait on its notify socket in the caller's own poll set.
    pub fn watcher(&self) -> &FamilyWatcher {
        &self.watcher
    }

    /// Applies an nlctrl event as if it had arrived as a notification, then reports the
    /// transition like [`poll`](Self::poll). For tests and replay of captured notifications:
    /// the kernel cannot be made to re-register a family on demand.
    ///
    /// # Errors
    /// join/leave on `data` failing.
    pub fn apply_event(
        &mut self,
        ev: CtrlEvent,
        data: &NetlinkSocket,
    ) -> Result<Option<Change>, SysError> {
        if ev.family_name() != self.cfg.genl.family {
            return Ok(None);
        }
        let (before, had_joined) = (self.state, self.ever_joined);
        let mut cycled = false;
        let r = self.apply(ev, data, &mut cycled, false);
        let change = self.change(before, had_joined, cycled);
        r.map(|()| change)
    }
}
