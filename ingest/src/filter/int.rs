//! The INT report filter (`[int.filter]`, off by default): on the `[int]` UDP sockets, keeps the
//! reports of accepted Telemetry Report versions and, optionally, accepted senders (reporting
//! switches' IPs), and drops the rest — in the kernel when it can.
//!
//! # Kernel path
//! `stel_int_filter` in the same eBPF object as the template filter (`ebpf/prog`), loaded once and
//! attached with `SO_ATTACH_BPF` to every INT socket. It runs in the sender's context before the
//! datagram is queued: a dropped report costs the collector no copy, no wakeup, no buffer. The
//! accepted versions and the sender flag live in [`INT_CONFIG_MAP`], the senders in
//! [`INT_SOURCES_MAP`] (IPv4 mapped into IPv6), the counters per CPU in [`INT_STATS_MAP`].
//!
//! UDP counts a datagram its socket filter dropped in the socket's drop counter (SK_MEMINFO_DROPS,
//! `udp_queue_rcv_one_skb`): the INT source subtracts [`IntFilterStats::dropped`] from it, so
//! `kernel_drops` stays what the buffer lost.
//!
//! # User-space fallback
//! Not built, no CAP_BPF, or `ebpf = false`: each INT thread applies the same rule
//! ([`stel_ebpf_common::int_verdict`]) to each datagram before decoding, with the same counters.
use std::{collections::HashSet, net::IpAddr, os::fd::BorrowedFd};

use serde::{Deserialize, Serialize};
pub use stel_ebpf_common::{
    int_source_key_v4, int_verdict, IntFilterStats, IntVerdict, INT_CONFIG_MAP, INT_SOURCES_MAP,
    INT_SOURCES_MAX_ENTRIES, INT_STATS_MAP,
};
use stel_ebpf_common::{INT_CONFIG_FLAGS, INT_CONFIG_VERSIONS, INT_FLAG_SOURCES, INT_PROGRAM_NAME};

use super::FilterError;

/// `[int.filter]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntFilterConfig {
    /// Filter the INT sockets at all (off by default: every datagram reaches the decoder).
    pub enabled: bool,
    /// Telemetry Report versions accepted: 0 (v0.5), 1 (v1.0, AmLight/NoviFlow), 2 (v2.0).
    pub versions: Vec<u8>,
    /// Reporting switches accepted (their IP, the datagram's source); empty = any sender.
    pub sources: Vec<IpAddr>,
    /// In the kernel (eBPF socket filter) when it loads; `false` = in user space by request.
    pub ebpf: bool,
}

impl Default for IntFilterConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            versions: vec![0, 1, 2],
            sources: Vec::new(),
            ebpf: true,
        }
    }
}

impl IntFilterConfig {
    /// Every problem with these settings, each naming `int.filter.<key>` and the value.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.enabled && self.versions.is_empty() {
            p.push(
                "int.filter.versions is empty: every report would be dropped; list the versions \
                 to keep, e.g. [1]"
                    .into(),
            );
        }
        for v in &self.versions {
            if *v > 15 {
                p.push(format!(
                    "int.filter.versions: {v} is not a report version (0 = v0.5, 1 = v1.0, 2 = v2.0)"
                ));
            }
        }
        if self.sources.len() > INT_SOURCES_MAX_ENTRIES as usize {
            p.push(format!(
                "int.filter.sources lists {} senders; at most {INT_SOURCES_MAX_ENTRIES}",
                self.sources.len()
            ));
        }
        p
    }

    /// The rule these settings give.
    pub fn rule(&self) -> IntFilterRule {
        IntFilterRule {
            versions: self
                .versions
                .iter()
                .filter(|&&v| v < 16)
                .fold(0u32, |m, &v| m | 1 << v),
            sources: (!self.sources.is_empty())
                .then(|| self.sources.iter().map(|&a| source_key(a)).collect()),
        }
    }
}

/// The map key of a sender: IPv6 as is, IPv4 (or IPv4-mapped) mapped into IPv6.
pub fn source_key(a: IpAddr) -> [u8; 16] {
    match a.to_canonical() {
        IpAddr::V4(v4) => int_source_key_v4(v4.octets()),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The filter's rule in user space (the fallback), the same decision as the kernel program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntFilterRule {
    /// Bit `v` = version `v` accepted.
    pub versions: u32,
    /// Accepted senders' keys; `None` = any.
    pub sources: Option<HashSet<[u8; 16]>>,
}

impl IntFilterRule {
    /// The verdict for a report `payload` from `src` (`None`: unknown sender, not accepted when
    /// senders are checked).
    pub fn verdict(&self, src: Option<IpAddr>, payload: &[u8]) -> IntVerdict {
        let source = self
            .sources
            .as_ref()
            .map(|s| src.is_some_and(|a| s.contains(&source_key(a))));
        int_verdict(payload.first().copied(), self.versions, source)
    }
}

/// The loaded kernel program and its maps.
struct Kernel {
    /// Kept alive with its maps while the program is attached.
    _ebpf: aya::Ebpf,
    stats: aya::maps::PerCpuArray<aya::maps::MapData, IntFilterStats>,
}

/// The INT filter: the kernel program, or the rule for the decode threads to apply.
pub struct IntFilter {
    kernel: Option<Box<Kernel>>,
    rule: IntFilterRule,
    /// Why the filter runs in user space, when it does.
    pub fallback_reason: Option<String>,
}

impl std::fmt::Debug for IntFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntFilter")
            .field("kernel", &self.kernel.is_some())
            .field("rule", &self.rule)
            .field("fallback_reason", &self.fallback_reason)
            .finish()
    }
}

impl IntFilter {
    /// Loads the kernel program with `cfg`'s rule and attaches it to every socket of `sockets`;
    /// on any failure (or `ebpf = false`) the user-space fallback, logged at error (warn when
    /// asked for). Call before dropping capabilities: loading needs CAP_BPF.
    pub fn new<'a>(
        cfg: &IntFilterConfig,
        sockets: impl IntoIterator<Item = BorrowedFd<'a>>,
    ) -> Self {
        let rule = cfg.rule();
        if !cfg.ebpf {
            tracing::warn!("INT filter: in user space by request ([int.filter] ebpf = false)");
            return Self {
                kernel: None,
                rule,
                fallback_reason: Some("in user space by request".into()),
            };
        }
        match Self::kernel(&rule, sockets) {
            Ok(k) => {
                tracing::info!("INT filter: eBPF socket filter attached (kernel path)");
                Self {
                    kernel: Some(Box::new(k)),
                    rule,
                    fallback_reason: None,
                }
            }
            Err(e) => {
                tracing::error!(
                    error = %e,
                    "INT filter: eBPF socket filter NOT available, filtering in user space (every \
                     datagram is copied to the daemon before it is dropped)"
                );
                Self {
                    kernel: None,
                    rule,
                    fallback_reason: Some(e.to_string()),
                }
            }
        }
    }

    /// The rule in user space only (capture files: there is no socket to attach to).
    pub fn user_space(cfg: &IntFilterConfig, why: &str) -> Self {
        Self {
            kernel: None,
            rule: cfg.rule(),
            fallback_reason: Some(why.into()),
        }
    }

    fn kernel<'a>(
        rule: &IntFilterRule,
        sockets: impl IntoIterator<Item = BorrowedFd<'a>>,
    ) -> Result<Kernel, FilterError> {
        let obj = super::OBJECT.ok_or(FilterError::NotBuilt(super::NOT_BUILT))?;
        let mut ebpf = aya::EbpfLoader::new().load(obj)?;
        let mut config: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
            ebpf.map_mut(INT_CONFIG_MAP)
                .ok_or(FilterError::Missing(INT_CONFIG_MAP))?,
        )
        .map_err(|source| FilterError::Map {
            what: INT_CONFIG_MAP,
            source,
        })?;
        let map_err = |source| FilterError::Map {
            what: INT_CONFIG_MAP,
            source,
        };
        config
            .set(INT_CONFIG_VERSIONS, rule.versions, 0)
            .map_err(map_err)?;
        let flags = if rule.sources.is_some() {
            INT_FLAG_SOURCES
        } else {
            0
        };
        config.set(INT_CONFIG_FLAGS, flags, 0).map_err(map_err)?;
        if let Some(srcs) = &rule.sources {
            let mut m: aya::maps::HashMap<_, [u8; 16], u8> = aya::maps::HashMap::try_from(
                ebpf.map_mut(INT_SOURCES_MAP)
                    .ok_or(FilterError::Missing(INT_SOURCES_MAP))?,
            )
            .map_err(|source| FilterError::Map {
                what: INT_SOURCES_MAP,
                source,
            })?;
            for k in srcs {
                m.insert(k, 1, 0).map_err(|source| FilterError::Map {
                    what: INT_SOURCES_MAP,
                    source,
                })?;
            }
        }
        let program =
            super::load_socket_filter(&mut ebpf, INT_PROGRAM_NAME, "INT socket filter program")?;
        for s in sockets {
            program.attach(s).map_err(|source| FilterError::Program {
                what: "attach (SO_ATTACH_BPF)",
                source,
            })?;
        }
        let stats = ebpf
            .take_map(INT_STATS_MAP)
            .ok_or(FilterError::Missing(INT_STATS_MAP))?;
        let stats = aya::maps::PerCpuArray::try_from(stats).map_err(|source| FilterError::Map {
            what: INT_STATS_MAP,
            source,
        })?;
        Ok(Kernel { _ebpf: ebpf, stats })
    }

    /// True when the kernel program filters.
    pub fn is_kernel(&self) -> bool {
        self.kernel.is_some()
    }

    /// The rule the decode threads apply when the kernel does not (`None` on the kernel path).
    pub fn user_rule(&self) -> Option<&IntFilterRule> {
        self.kernel.is_none().then_some(&self.rule)
    }

    /// The kernel program's per-CPU counters summed (`None` on the user-space path: the threads
    /// count).
    pub fn kernel_stats(&self) -> Option<IntFilterStats> {
        let k = self.kernel.as_ref()?;
        match k.stats.get(&stel_ebpf_common::STATS_INDEX, 0) {
            Ok(per_cpu) => {
                let mut sum = IntFilterStats::default();
                for s in per_cpu.iter() {
                    sum.add(s);
                }
                Some(sum)
            }
            Err(e) => {
                tracing::warn!(error = %e, "INT filter: reading the counters failed.");
                None
            }
        }
    }
}

/// `[int.filter]` as the status shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IntFilterStatus {
    /// `kernel` or `user_space`.
    pub kind: &'static str,
    /// Why in user space, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    /// Datagrams the filter looked at.
    pub seen_datagrams: u64,
    /// Datagrams kept (handed to the decoder).
    pub kept_datagrams: u64,
    /// Datagrams dropped: report version not accepted.
    pub dropped_version_datagrams: u64,
    /// Datagrams dropped: sender not accepted.
    pub dropped_source_datagrams: u64,
    /// Empty datagrams (kept; the decoder counts them as `empty`).
    pub empty_datagrams: u64,
}

impl IntFilterStatus {
    /// From the summed counters.
    pub fn new(kind: &'static str, reason: Option<String>, s: &IntFilterStats) -> Self {
        Self {
            kind,
            fallback_reason: reason,
            seen_datagrams: s.seen,
            kept_datagrams: s.kept,
            dropped_version_datagrams: s.dropped_version,
            dropped_source_datagrams: s.dropped_source,
            empty_datagrams: s.empty,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_gives_the_rule_and_names_its_problems() {
        let c = IntFilterConfig {
            enabled: true,
            versions: vec![1],
            sources: vec!["127.0.0.1".parse().unwrap(), "2001:db8::1".parse().unwrap()],
            ebpf: true,
        };
        assert!(c.problems().is_empty());
        let r = c.rule();
        assert_eq!(r.versions, 0b10);
        let v1 = [0x14u8, 0];
        let local = Some("127.0.0.1".parse().unwrap());
        let mapped = Some("::ffff:127.0.0.1".parse().unwrap());
        assert_eq!(r.verdict(local, &v1), IntVerdict::Keep);
        assert_eq!(r.verdict(mapped, &v1), IntVerdict::Keep);
        assert_eq!(
            r.verdict(Some("2001:db8::1".parse().unwrap()), &v1),
            IntVerdict::Keep
        );
        assert_eq!(
            r.verdict(Some("127.0.0.2".parse().unwrap()), &v1),
            IntVerdict::DropSource
        );
        assert_eq!(r.verdict(None, &v1), IntVerdict::DropSource);
        assert_eq!(r.verdict(local, &[0x02]), IntVerdict::DropVersion);
        assert_eq!(r.verdict(local, &[]), IntVerdict::Empty);
        let any = IntFilterConfig::default().rule();
        assert_eq!(any.versions, 0b111);
        assert_eq!(any.verdict(None, &[0x21]), IntVerdict::Keep);

        let bad = IntFilterConfig {
            enabled: true,
            versions: vec![],
            ..IntFilterConfig::default()
        };
        assert_eq!(bad.problems().len(), 1);
        let bad = IntFilterConfig {
            versions: vec![16],
            ..IntFilterConfig::default()
        };
        assert!(bad.problems()[0].contains("16"), "{:?}", bad.problems());
    }
}
