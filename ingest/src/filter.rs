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

use std::{
    os::fd::BorrowedFd,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

pub use stel_ebpf_common::{
    classify, FilterStats, Framing, Verdict, STATS_MAP, TEMPLATE_MAP, TEMPLATE_MAP_MAX_ENTRIES,
};

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
    /// More than [`TEMPLATE_MAP_MAX_ENTRIES`] registered templates.
    #[error("more than {TEMPLATE_MAP_MAX_ENTRIES} templates registered")]
    TooManyTemplates,
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

/// Counters of the user-space fallback (atomics so [`TemplateFilter::keep`] takes `&self`).
#[derive(Debug, Default)]
struct UserCounters {
    seen: AtomicU64,
    kept: AtomicU64,
    dropped: AtomicU64,
    too_short: AtomicU64,
}

impl UserCounters {
    #[inline]
    fn count(&self, v: Verdict) {
        self.seen.fetch_add(1, Relaxed);
        if v.keep() {
            self.kept.fetch_add(1, Relaxed);
        } else {
            self.dropped.fetch_add(1, Relaxed);
        }
        if v == Verdict::TooShort {
            self.too_short.fetch_add(1, Relaxed);
        }
    }

    fn get(&self) -> FilterStats {
        FilterStats {
            seen: self.seen.load(Relaxed),
            kept: self.kept.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            too_short: self.too_short.load(Relaxed),
        }
    }
}

/// The loaded kernel program and its maps, opened into typed handles (a key/value size mismatch
/// with the object is an error at load, not a miscount later).
struct Kernel {
    ebpf: aya::Ebpf,
    templates: aya::maps::HashMap<aya::maps::MapData, u16, u8>,
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
    templates: TemplateSet,
    user: UserCounters,
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
        match Self::kernel() {
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
                Self::fallback(e.to_string())
            }
        }
    }

    /// The kernel filter, or why it cannot be had. Loads the object and the program (the
    /// verifier runs here) and opens both maps into typed handles.
    ///
    /// # Errors
    /// [`FilterError`]: not built, no CAP_BPF, verifier rejection, a map layout mismatch.
    pub fn kernel() -> Result<Self, FilterError> {
        let obj = OBJECT.ok_or(FilterError::NotBuilt(NOT_BUILT))?;
        let mut ebpf = aya::Ebpf::load(obj)?;
        let program: &mut aya::programs::SocketFilter = ebpf
            .program_mut(stel_ebpf_common::PROGRAM_NAME)
            .ok_or(FilterError::Missing("socket filter program"))?
            .try_into()
            .map_err(|source| FilterError::Program {
                what: "type",
                source,
            })?;
        program.load().map_err(|source| FilterError::Program {
            what: "load (verifier)",
            source,
        })?;
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
        Ok(Self {
            backend: Backend::Kernel(Box::new(Kernel {
                ebpf,
                templates,
                stats,
            })),
            templates: TemplateSet::new(),
            user: UserCounters::default(),
        })
    }

    /// The user-space filter, chosen explicitly (e.g. a `--no-ebpf` option); logged at warn.
    pub fn user_space() -> Self {
        tracing::warn!("template filter: user space by request (eBPF socket filter not loaded)");
        Self::fallback("user-space filtering requested".into())
    }

    fn fallback(reason: String) -> Self {
        Self {
            backend: Backend::User { reason },
            templates: TemplateSet::new(),
            user: UserCounters::default(),
        }
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
        if self.templates.contains(tid) {
            return Ok(());
        }
        if self.templates.len() >= TEMPLATE_MAP_MAX_ENTRIES as usize {
            return Err(FilterError::TooManyTemplates);
        }
        if let Backend::Kernel(k) = &mut self.backend {
            k.templates
                .insert(tid, stel_ebpf_common::TEMPLATE_REGISTERED, 0)
                .map_err(|source| FilterError::Map {
                    what: TEMPLATE_MAP,
                    source,
                })?;
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
            k.templates
                .remove(&tid)
                .map_err(|source| FilterError::Map {
                    what: TEMPLATE_MAP,
                    source,
                })?;
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
    pub fn keep(&self, ipfix_payload: &[u8]) -> bool {
        if self.is_kernel() {
            return true;
        }
        let v = payload_verdict(ipfix_payload, &self.templates);
        self.user.count(v);
        v.keep()
    }

    /// Counters: the kernel program's per-CPU counters summed (per datagram), or the fallback's
    /// (per payload).
    ///
    /// # Errors
    /// The per-CPU map lookup failing.
    pub fn stats(&self) -> Result<FilterStats, FilterError> {
        match &self.backend {
            Backend::User { .. } => Ok(self.user.get()),
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
