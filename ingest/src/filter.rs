//! The template filter: keeps IPFIX messages whose data sets belong to registered template IDs,
//! in the kernel when it can, in user space when it cannot — with the same decision either way.
//!
//! # Kernel path
//! The socket filter (`ebpf/prog`, built by `build.rs` and embedded here) is attached with
//! `SO_ATTACH_BPF` to the receiving netlink socket. It runs in the *sender's* context for every
//! datagram, before the datagram is charged to the receive buffer, so a dropped datagram costs the
//! receiver nothing: no copy, no wakeup, no rmem, no SK_MEMINFO_DROPS. Registered template IDs live
//! in a BPF hash map ([`TEMPLATE_MAP`]) that [`TemplateFilter::register`] /
//! [`TemplateFilter::unregister`] update live; counters are per CPU ([`STATS_MAP`]) and
//! [`TemplateFilter::stats`] sums them.
//!
//! Needs: kernel ≥ 4.4 (`BPF_PROG_TYPE_SOCKET_FILTER` with maps via `SO_ATTACH_BPF`, bounded
//! loops ≥ 5.3); CAP_BPF (or CAP_SYS_ADMIN) to load. Attaching to a socket we own and updating the
//! map through the fd we already hold need no capability (kernel ≥ 6.5 moved the
//! `unprivileged_bpf_disabled` check to map/program creation), so the daemon can drop its
//! capabilities after [`TemplateFilter::attach`].
//!
//! # User-space fallback
//! When the object was not built (no eBPF toolchain; `build.rs` warned) or loading fails (no
//! CAP_BPF, an old kernel), [`TemplateFilter::new`] logs an error and falls back:
//! [`TemplateFilter::keep`] applies the same rule ([`stel_ebpf_common::classify`], the very function
//! the kernel program runs) to each IPFIX payload, against a 8 KiB bitmap of template IDs. No
//! allocation per message.
//!
//! # The rule
//! See [`stel_ebpf_common`]: drop only what is provably nothing but data sets of unregistered
//! templates; keep templates, non-IPFIX, malformed and too-short input. A message with data sets of
//! several templates is kept when any one is registered; the decoder counts the others as
//! unknown-template. The kernel decides per datagram, the fallback per netlink payload (the same
//! for one message per datagram, which is what SONiC and `stel-emu` send).
//!
//! Note for sequence accounting: messages dropped here never reach the decoder, so a per-domain
//! sequence gap can be filter drops rather than loss when one observation domain carries both
//! registered and unregistered templates; [`FilterStats::dropped`] tells them apart.

use std::os::fd::BorrowedFd;

pub mod int;

/// Takes socket-filter program `name` out of a loaded eBPF object and loads it into the kernel
/// (the verifier runs here): the step both filters (netlink templates, INT reports) share.
fn load_socket_filter<'a>(
    ebpf: &'a mut aya::Ebpf,
    name: &str,
    what: &'static str,
) -> Result<&'a mut aya::programs::SocketFilter, FilterError> {
    let program: &mut aya::programs::SocketFilter = ebpf
        .program_mut(name)
        .ok_or(FilterError::Missing(what))?
        .try_into()
        .map_err(|source| FilterError::Program {
            what: "type",
            source,
        })?;
    program.load().map_err(|source| FilterError::Program {
        what: "load (verifier)",
        source,
    })?;
    Ok(program)
}

pub use stel_ebpf_common::{
    classify, learn_templates, FilterStats, Framing, Verdict, CONFIG_MAP, STATS_MAP, TEMPLATE_MAP,
    TEMPLATE_MAP_MAX_ENTRIES,
};

/// Which template IDs the filter keeps data of (see [`stel_ebpf_common`]'s "Policies").
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum FilterPolicy {
    /// `registered` where a STATE_DB source is configured on the switch's genl family, else
    /// `learn`.
    #[default]
    Auto,
    /// Only templates registered by the control plane (STATE_DB, session files): SONiC's
    /// "discard" rule. Data of any other template is dropped (counted in `filter.dropped`).
    Registered,
    /// A template seen on the socket registers its IDs in the filter before its data arrives
    /// (in the kernel, in the sender's context); data of never-announced templates is dropped.
    Learn,
}

impl FilterPolicy {
    /// `Auto` resolved: `registered` only for the switch's genl family with STATE_DB.
    pub fn resolve(self, genl_with_state_db: bool) -> Self {
        match self {
            Self::Auto if genl_with_state_db => Self::Registered,
            Self::Auto => Self::Learn,
            p => p,
        }
    }

    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Registered => "registered",
            Self::Learn => "learn",
        }
    }
}

/// Why the kernel filter is not available.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// The object was not built into this binary.
    #[error("the eBPF socket filter was not built into this binary: {0}")]
    NotBuilt(&'static str),
    /// `Ebpf::load` failed (object parse, map creation: usually no CAP_BPF).
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    /// Program load (verifier) or attach failed.
    #[error("eBPF program {what}: {source}")]
    Program {
        what: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map could not be opened with the expected types, or an update failed.
    #[error("eBPF map {what}: {source}")]
    Map {
        what: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    /// The object lacks a map or the program this code expects.
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
    /// A template ID below 256 (those are set IDs, not templates).
    #[error("template ID {0} is not a data set ID (must be >= 256)")]
    InvalidTemplateId(u16),
    /// More templates than the map holds.
    #[error("the template filter holds at most {0} template IDs (raise [filter] max_templates)")]
    TooManyTemplates(u32),
}

/// A set of template IDs: a 65,536-bit bitmap (8 KiB), O(1) without hashing.
#[derive(Clone)]
pub struct TemplateSet {
    bits: Box<[u64; 1024]>,
    len: u32,
}

impl std::fmt::Debug for TemplateSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl Default for TemplateSet {
    fn default() -> Self {
        Self::new()
    }
}

impl TemplateSet {
    pub fn new() -> Self {
        Self {
            bits: Box::new([0; 1024]),
            len: 0,
        }
    }

    #[inline]
    pub fn contains(&self, tid: u16) -> bool {
        self.bits[tid as usize >> 6] & (1 << (tid & 63)) != 0
    }

    /// Adds `tid`; false if it was already there.
    pub fn insert(&mut self, tid: u16) -> bool {
        let w = &mut self.bits[tid as usize >> 6];
        let b = 1 << (tid & 63);
        let new = *w & b == 0;
        *w |= b;
        self.len += new as u32;
        new
    }

    /// Removes `tid`; false if it was not there.
    pub fn remove(&mut self, tid: u16) -> bool {
        let w = &mut self.bits[tid as usize >> 6];
        let b = 1 << (tid & 63);
        let had = *w & b != 0;
        *w &= !b;
        self.len -= had as u32;
        had
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The IDs in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (0..=u16::MAX).filter(|&t| self.contains(t))
    }
}

/// The filter's decision for one IPFIX payload (what follows nlmsghdr + genlmsghdr).
#[inline]
pub fn payload_verdict(ipfix_payload: &[u8], templates: &TemplateSet) -> Verdict {
    classify(ipfix_payload, Framing::Ipfix, |t| templates.contains(t))
}

/// The filter's decision for a whole netlink datagram, exactly as the kernel program makes it.
#[inline]
pub fn datagram_verdict(datagram: &[u8], templates: &TemplateSet) -> Verdict {
    classify(datagram, Framing::Netlink, |t| templates.contains(t))
}

/// The loaded kernel program and its maps, opened into typed handles (a key/value size mismatch
/// with the object is an error at load, not a miscount later).
struct Kernel {
    ebpf: aya::Ebpf,
    templates: aya::maps::HashMap<aya::maps::MapData, u16, u8>,
    config: aya::maps::Array<aya::maps::MapData, u32>,
    stats: aya::maps::PerCpuArray<aya::maps::MapData, FilterStats>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("ebpf", &self.ebpf)
            .field("templates", &self.templates)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
enum Backend {
    Kernel(Box<Kernel>),
    User { reason: String },
}

/// The template filter (see the module docs).
#[derive(Debug)]
pub struct TemplateFilter {
    backend: Backend,
    /// Template IDs registered by the control plane (and, in user space, learned).
    templates: TemplateSet,
    /// Most template IDs the map holds.
    max_templates: u32,
    policy: FilterPolicy,
    /// The user-space fallback's counters (owned by the reader thread).
    user: FilterStats,
}

#[cfg(stel_ebpf)]
static OBJECT: Option<&[u8]> = Some(aya::include_bytes_aligned!(env!("STEL_EBPF_OBJECT")));
#[cfg(not(stel_ebpf))]
static OBJECT: Option<&[u8]> = None;

/// Why the object is absent, as `build.rs` reported it.
const NOT_BUILT: &str = match option_env!("STEL_EBPF_MISSING") {
    Some(s) => s,
    None => "unknown reason",
};

impl TemplateFilter {
    /// Whether the kernel program was built into this binary.
    pub const fn kernel_object_built() -> bool {
        OBJECT.is_some()
    }

    /// The kernel filter if it loads, else the user-space fallback; the fallback is logged at
    /// error level (it copies every message to user space first). Call before dropping
    /// capabilities: loading needs CAP_BPF.
    pub fn new() -> Self {
        Self::with_capacity(TEMPLATE_MAP_MAX_ENTRIES)
    }

    /// As [`Self::new`], with a template map of `max_templates` entries.
    pub fn with_capacity(max_templates: u32) -> Self {
        match Self::kernel_with_capacity(max_templates) {
            Ok(f) => {
                tracing::info!("template filter: eBPF socket filter loaded (kernel path)");
                f
            }
            Err(e) => {
                tracing::error!(
                    error = %e,
                    "template filter: eBPF socket filter NOT available, filtering in user space \
                     (every message is copied to the daemon before it is dropped)"
                );
                Self::fallback(e.to_string(), max_templates)
            }
        }
    }

    /// The kernel filter, or why it cannot be had. Loads the object and the program (the
    /// verifier runs here) and opens both maps into typed handles.
    ///
    /// # Errors
    /// [`FilterError`]: not built, no CAP_BPF, verifier rejection, a map layout mismatch.
    pub fn kernel() -> Result<Self, FilterError> {
        Self::kernel_with_capacity(TEMPLATE_MAP_MAX_ENTRIES)
    }

    /// As [`Self::kernel`], with a template map of `max_templates` entries.
    ///
    /// # Errors
    /// As [`Self::kernel`].
    pub fn kernel_with_capacity(max_templates: u32) -> Result<Self, FilterError> {
        let obj = OBJECT.ok_or(FilterError::NotBuilt(NOT_BUILT))?;
        let max_templates = max_templates.max(1);
        let mut ebpf = aya::EbpfLoader::new()
            .map_max_entries(TEMPLATE_MAP, max_templates)
            .load(obj)?;
        load_socket_filter(
            &mut ebpf,
            stel_ebpf_common::PROGRAM_NAME,
            "socket filter program",
        )?;
        let templates = ebpf
            .take_map(TEMPLATE_MAP)
            .ok_or(FilterError::Missing(TEMPLATE_MAP))?;
        let templates =
            aya::maps::HashMap::try_from(templates).map_err(|source| FilterError::Map {
                what: TEMPLATE_MAP,
                source,
            })?;
        let stats = ebpf
            .take_map(STATS_MAP)
            .ok_or(FilterError::Missing(STATS_MAP))?;
        let stats = aya::maps::PerCpuArray::try_from(stats).map_err(|source| FilterError::Map {
            what: STATS_MAP,
            source,
        })?;
        let config = ebpf
            .take_map(CONFIG_MAP)
            .ok_or(FilterError::Missing(CONFIG_MAP))?;
        let config = aya::maps::Array::try_from(config).map_err(|source| FilterError::Map {
            what: CONFIG_MAP,
            source,
        })?;
        Ok(Self {
            backend: Backend::Kernel(Box::new(Kernel {
                ebpf,
                templates,
                config,
                stats,
            })),
            templates: TemplateSet::new(),
            max_templates,
            policy: FilterPolicy::Registered,
            user: FilterStats::default(),
        })
    }

    /// The user-space filter, chosen explicitly (e.g. a `--no-ebpf` option); logged at warn.
    pub fn user_space() -> Self {
        tracing::warn!("template filter: user space by request (eBPF socket filter not loaded)");
        Self::user_space_quiet(TEMPLATE_MAP_MAX_ENTRIES)
    }

    /// The user-space filter, where no socket exists to attach to (file input): not logged.
    pub fn user_space_quiet(max_templates: u32) -> Self {
        Self::fallback("user-space filtering requested".into(), max_templates)
    }

    fn fallback(reason: String, max_templates: u32) -> Self {
        Self {
            backend: Backend::User { reason },
            templates: TemplateSet::new(),
            max_templates: max_templates.max(1),
            policy: FilterPolicy::Registered,
            user: FilterStats::default(),
        }
    }

    /// Sets the policy (`Auto` must be resolved first; it counts as `learn`). Live: the kernel
    /// program reads it per datagram.
    ///
    /// # Errors
    /// The config map update failing.
    pub fn set_policy(&mut self, policy: FilterPolicy) -> Result<(), FilterError> {
        let policy = policy.resolve(false);
        if let Backend::Kernel(k) = &mut self.backend {
            let v = match policy {
                FilterPolicy::Registered => stel_ebpf_common::POLICY_REGISTERED,
                _ => stel_ebpf_common::POLICY_LEARN,
            };
            k.config
                .set(stel_ebpf_common::CONFIG_POLICY, v, 0)
                .map_err(|source| FilterError::Map {
                    what: CONFIG_MAP,
                    source,
                })?;
        }
        self.policy = policy;
        Ok(())
    }

    /// The policy in force (`registered` or `learn`).
    pub fn policy(&self) -> FilterPolicy {
        self.policy
    }

    /// Most template IDs the map holds.
    pub fn max_templates(&self) -> u32 {
        self.max_templates
    }

    /// True when the kernel program does the filtering.
    pub fn is_kernel(&self) -> bool {
        matches!(self.backend, Backend::Kernel(_))
    }

    /// Why this is the user-space fallback (`None` for the kernel filter): for the status output.
    pub fn fallback_reason(&self) -> Option<&str> {
        match &self.backend {
            Backend::Kernel(_) => None,
            Backend::User { reason } => Some(reason),
        }
    }

    /// Attaches the kernel program to `socket` (`SO_ATTACH_BPF`; replaces any filter there). Use
    /// the receiving netlink socket, after `bind` and before or after joining the group: datagrams
    /// queued before the attach are not filtered. A no-op for the user-space fallback.
    ///
    /// # Errors
    /// `setsockopt(SO_ATTACH_BPF)` failing.
    pub fn attach(&mut self, socket: BorrowedFd<'_>) -> Result<(), FilterError> {
        let Backend::Kernel(k) = &mut self.backend else {
            return Ok(());
        };
        let program: &mut aya::programs::SocketFilter = k
            .ebpf
            .program_mut(stel_ebpf_common::PROGRAM_NAME)
            .ok_or(FilterError::Missing("socket filter program"))?
            .try_into()
            .map_err(|source| FilterError::Program {
                what: "type",
                source,
            })?;
        program
            .attach(socket)
            .map_err(|source| FilterError::Program {
                what: "attach (SO_ATTACH_BPF)",
                source,
            })
    }

    /// Registers template `tid`: its data sets are kept from now on (live: the next datagram the
    /// kernel delivers sees it). Idempotent.
    ///
    /// # Errors
    /// `tid < 256`, more than [`TEMPLATE_MAP_MAX_ENTRIES`] templates, a failed map update.
    pub fn register(&mut self, tid: u16) -> Result<(), FilterError> {
        if tid < stel_ebpf_common::MIN_DATA_SET_ID {
            return Err(FilterError::InvalidTemplateId(tid));
        }
        if self.templates.contains(tid) && !self.is_kernel() {
            return Ok(());
        }
        match &mut self.backend {
            // The kernel map is the authority on room: it may hold IDs the program learned.
            Backend::Kernel(k) => k
                .templates
                .insert(tid, stel_ebpf_common::TEMPLATE_REGISTERED, 0)
                .map_err(|source| match &source {
                    aya::maps::MapError::SyscallError(e)
                        if e.io_error.raw_os_error() == Some(libc::E2BIG) =>
                    {
                        FilterError::TooManyTemplates(self.max_templates)
                    }
                    _ => FilterError::Map {
                        what: TEMPLATE_MAP,
                        source,
                    },
                })?,
            Backend::User { .. } if self.templates.len() >= self.max_templates as usize => {
                return Err(FilterError::TooManyTemplates(self.max_templates));
            }
            Backend::User { .. } => {}
        }
        self.templates.insert(tid);
        Ok(())
    }

    /// Unregisters template `tid`: its data sets are dropped from now on. Idempotent.
    ///
    /// # Errors
    /// A failed map update.
    pub fn unregister(&mut self, tid: u16) -> Result<(), FilterError> {
        if !self.templates.contains(tid) {
            return Ok(());
        }
        if let Backend::Kernel(k) = &mut self.backend {
            match k.templates.remove(&tid) {
                Ok(()) => {}
                // Gone already (never learned by the kernel, or removed): the goal is met.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(source) => {
                    return Err(FilterError::Map {
                        what: TEMPLATE_MAP,
                        source,
                    })
                }
            }
        }
        self.templates.remove(tid);
        Ok(())
    }

    /// The registered template IDs.
    pub fn templates(&self) -> &TemplateSet {
        &self.templates
    }

    /// Whether the caller should decode this IPFIX payload. Kernel filter: always true (the kernel
    /// already dropped what it drops; no work here). Fallback: the filter rule, counted.
    #[inline]
    pub fn keep(&mut self, ipfix_payload: &[u8]) -> bool {
        if self.is_kernel() {
            return true;
        }
        let v = payload_verdict(ipfix_payload, &self.templates);
        self.user.count(v);
        if v == Verdict::Drop {
            if let Some(&[a, b]) = ipfix_payload.get(16..18) {
                self.user.last_dropped_set_id = u64::from(u16::from_be_bytes([a, b]));
            }
        }
        if v == Verdict::Template && self.policy == FilterPolicy::Learn {
            let (set, max, stats) = (
                &mut self.templates,
                self.max_templates as usize,
                &mut self.user,
            );
            learn_templates(ipfix_payload, Framing::Ipfix, |tid| {
                if set.contains(tid) {
                } else if set.len() < max {
                    set.insert(tid);
                    stats.learned += 1;
                } else {
                    stats.learn_failed += 1;
                }
            });
        }
        v.keep()
    }

    /// Counters: the kernel program's per-CPU counters summed (per datagram), or the fallback's
    /// (per payload).
    ///
    /// # Errors
    /// The per-CPU map lookup failing.
    pub fn stats(&self) -> Result<FilterStats, FilterError> {
        match &self.backend {
            Backend::User { .. } => Ok(self.user),
            Backend::Kernel(k) => {
                let per_cpu = k
                    .stats
                    .get(&stel_ebpf_common::STATS_INDEX, 0)
                    .map_err(|source| FilterError::Map {
                        what: STATS_MAP,
                        source,
                    })?;
                let mut sum = FilterStats::default();
                for s in per_cpu.iter() {
                    sum.add(s);
                }
                Ok(sum)
            }
        }
    }
}

impl Default for TemplateFilter {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
